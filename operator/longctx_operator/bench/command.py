"""`longctx bench`: the arguments, and what each mode does.

    longctx bench -f cr.yaml --render          # the ConfigMap and Job, as YAML
    longctx bench -f cr.yaml                   # create them (kubectl apply)
    longctx bench --url URL --model M ...      # run here, against an endpoint
    longctx bench sweep -f a.yaml --url A -f b.yaml --url B ...   # two layouts, one trace
    longctx bench sweep --report a.json --report b.json           # compare finished runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from longctx_operator.bench.trace import TraceParams, corpus_of_words, read_traces, synthesize

REPO = Path(__file__).resolve().parents[3]
BENCH_ENV_SCRIPT = REPO / "tools" / "bench-env.sh"
# The synthetic generator's parameters as flags (its model is --model's).
TRACE_FLAGS = [f for f in fields(TraceParams) if f.name != "model"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="replay agentic traces against a deployment and report "
                       "the seed's figures (docs/bench.md)")
    p.add_argument("action", nargs="?", choices=("run", "sweep"), default="run",
                   help="run (default): one deployment; sweep: compare two")
    p.add_argument("-f", "--file", action="append", default=[],
                   help="the LongContextDeployment (sweep: once per deployment)")
    p.add_argument("--url", action="append", default=[], help="OpenAI-compatible endpoint "
                   "(sweep: once per -f, same order); with -f and --render, the Job's target")
    p.add_argument("--model", help="served model name (default: the CR's)")
    p.add_argument("--tokenizer", help="path or name of the model's tokenizer "
                   "(default: --model; in a Job: the model's PVC)")
    p.add_argument("--gpus", type=int, help="GPUs behind --url (default: the CR's plan)")
    p.add_argument("--engine-metrics", action="append", default=[], metavar="[N:]ROLE=URL",
                   help="an engine (or headless Service) whose /metrics is read before and "
                        "after each concurrency; N picks the sweep's deployment (default 1)")
    p.add_argument("--concurrency", default="1,2,4", help="comma-separated (default 1,2,4)")
    p.add_argument("--trace", help="Weka traces (JSON Lines, one session a line); default: "
                   "the synthetic generator with the parameters below")
    p.add_argument("--corpus", help="text the tool builds prompts from (default: its own)")
    p.add_argument("--word-corpus", action="store_true", help="a corpus of w0..w899 words "
                   "(for the word-level tokenizers of the test models)")
    for f in TRACE_FLAGS:
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None,
                       help=f"synthetic trace: {f.name} (default {f.default})")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per concurrency")
    p.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                   help="a progress line this often (default 5)")
    p.add_argument("--label", help="name in the report and plot (default: the CR's name)")
    p.add_argument("--out", default="bench-results", help="directory for report.json, "
                   "report.png and the tool's files (default ./bench-results)")
    p.add_argument("--emit-json", action="store_true", help="print the report as the last "
                   "line of standard output (what the Job does)")
    p.add_argument("--render", action="store_true", help="print the ConfigMap and Job")
    p.add_argument("--image", help="bench image for the Job (default ghcr.io/longctx/bench)")
    p.add_argument("--report", action="append", default=[], help="sweep: finished reports")
    p.set_defaults(func=cmd_bench)


def bench_env() -> Path:
    """tools/bench-env.sh's venv, or LONGCTX_BENCH_ENV (the bench image sets it)."""
    if os.environ.get("LONGCTX_BENCH_ENV"):
        return Path(os.environ["LONGCTX_BENCH_ENV"])
    proc = subprocess.run([str(BENCH_ENV_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit("error: tools/bench-env.sh failed (it installs inference-perf 0.7.0 "
                         "from PyPI and needs Python >= 3.12):\n" + proc.stderr[-2000:])
    return Path(proc.stdout.strip().splitlines()[-1])


def in_bench_env(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "operator"), str(REPO / "core")]
        + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    return subprocess.run([str(bench_env() / "bin" / "python"), "-m",
                           "longctx_operator.bench.bench_env_tasks", *argv],
                          capture_output=True, text=True, env=env)


def _traces(args: argparse.Namespace, model: str) -> tuple[list[dict[str, Any]], dict]:
    if args.trace:
        return read_traces(args.trace), {"file": args.trace}
    given = {f.name: getattr(args, f.name) for f in TRACE_FLAGS
             if getattr(args, f.name) is not None}
    params = TraceParams(**{"model": model, **given})
    return synthesize(params), {"synthetic": {f.name: getattr(params, f.name)
                                              for f in fields(TraceParams)}}


def _concurrencies(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"error: --concurrency={text!r}: give positive integers, e.g. 1,2,4")
    return values


def _engines(items: list[str], target: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        index, sep, rest = item.partition(":")
        if sep and index.isdigit():
            if int(index) != target:
                continue
            item = rest
        role, eq, url = item.partition("=")
        if not eq or not url.startswith("http"):
            raise SystemExit(f"error: --engine-metrics={item!r}: give ROLE=http://HOST:PORT")
        out.setdefault(role, []).append(url)
    return out


def _load(path: str) -> tuple[dict[str, Any], Any]:
    from longctx_core.api import spec as api

    from longctx_operator.manifests import read_manifest
    cr = read_manifest(path)
    return cr, api.load_spec(cr.get("spec"))


def run_one(args: argparse.Namespace, index: int, file: str | None, url: str,
            out: Path) -> dict[str, Any]:
    """One deployment at every concurrency; writes out/report.json and out/report.png."""
    from longctx_operator.bench import measure, report

    cr, spec = _load(file) if file else (None, None)
    model = args.model or (cr["spec"]["model"].get("servedName") or cr["spec"]["model"]["name"]
                           if cr else None)
    if not model:
        raise SystemExit("error: --model is required without -f")
    gpus = args.gpus or (report.gpu_count(spec) if spec is not None else None)
    if not gpus:
        raise SystemExit("error: --gpus is required without -f (the GPUs behind --url)")
    traces, source = _traces(args, model)
    corpus = args.corpus
    out.mkdir(parents=True, exist_ok=True)
    if args.word_corpus:
        corpus = str(out / "corpus.txt")
        Path(corpus).write_text(corpus_of_words())
    target = measure.Target(url=url, model=model, tokenizer=args.tokenizer or model,
                           num_gpus=gpus, engines=_engines(args.engine_metrics, index),
                           corpus=corpus,
                           label=args.label or (cr["metadata"]["name"] if cr else model))
    python = bench_env() / "bin" / "python"
    result = measure.run(target, traces, _concurrencies(args.concurrency), python,
                        out / "work", timeout_s=args.timeout,
                        progress_every_s=args.progress_every)
    configs = {c: yaml.safe_load((out / "work" / f"concurrency-{c}" / "inference-perf.yaml")
                                 .read_text())
               for c in (p["concurrency"] for p in result["points"])}
    full = report.complete(result, cr, spec, configs, source)
    (out / "report.json").write_text(json.dumps(full, indent=1))
    (out / "report.md").write_text(report.table(full))
    checked = in_bench_env("validate", str(out / "report.json"))
    full["llmd_reports_valid"] = checked.returncode == 0
    if checked.returncode != 0:
        full["llmd_report_problems"] = checked.stderr[-3000:]
    (out / "report.json").write_text(json.dumps(full, indent=1))
    plotted = in_bench_env("plot", str(out / "report.json"), str(out / "report.png"))
    if plotted.returncode != 0:
        print(f"warning: the plot failed:\n{plotted.stderr[-2000:]}", file=sys.stderr)
    return full


def _sweep(args: argparse.Namespace, out: Path) -> int:
    from longctx_operator.bench.figures import ratio_at_equal_throughput

    if args.report:
        reports = [json.loads(Path(p).read_text()) for p in args.report]
    else:
        if len(args.file) != 2 or len(args.url) != 2:
            raise SystemExit("error: sweep needs -f A.yaml --url URL_A -f B.yaml --url URL_B "
                             "(or --report A.json --report B.json)")
        reports = [run_one(args, i + 1, f, u, out / f"{i + 1}")
                   for i, (f, u) in enumerate(zip(args.file, args.url))]
    if len(reports) != 2:
        raise SystemExit("error: sweep compares exactly two reports")
    curves = [[(p["interactivity_p90_tok_s_per_user"], p["throughput_tok_s_per_gpu"])
               for p in r["points"] if "throughput_tok_s_per_gpu" in p] for r in reports]
    rows = ratio_at_equal_throughput(*curves)
    a, b = (r["target"]["label"] for r in reports)
    print(f"P90 interactivity at equal throughput: {b} over {a}")
    print("| tok/s/GPU | " + a + " tok/s/user | " + b + " tok/s/user | ratio |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['throughput_tok_s_per_gpu']:.1f} | {row['interactivity_a']:.2f} | "
              f"{row['interactivity_b']:.2f} | {row['ratio_b_over_a']:.2f}x |")
    if not rows:
        print("(the two curves share no throughput range: widen --concurrency)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps({"a": a, "b": b, "rows": rows}, indent=1))
    paths = [str(out / "sweep-a.json"), str(out / "sweep-b.json")]
    for path, r in zip(paths, reports):
        Path(path).write_text(json.dumps(r))
    in_bench_env("plot", paths[0], str(out / "sweep.png"), paths[1])
    return 0 if rows else 1


def _render_or_create(args: argparse.Namespace) -> int:
    from longctx_core.plan.roles import serving_plan

    from longctx_operator.manifests import ManifestDumper
    from longctx_operator.bench import job
    from longctx_operator.bench.trace import to_jsonl

    cr, spec = _load(args.file[0])
    plan = serving_plan(spec, cr["metadata"]["name"])
    model = cr["spec"]["model"].get("servedName") or cr["spec"]["model"]["name"]
    traces, _ = _traces(args, model)
    corpus = Path(args.corpus).read_text() if args.corpus else \
        corpus_of_words() if args.word_corpus else None
    bench_args = ["--concurrency", args.concurrency, "--timeout", str(args.timeout),
                  "--label", args.label or cr["metadata"]["name"]]
    try:
        objects = job.render(cr, plan, traces_jsonl=to_jsonl(traces),
                             corpus=corpus, bench_args=bench_args,
                             url=args.url[0] if args.url else None, tokenizer=args.tokenizer,
                             image=args.image or job.BENCH_IMAGE)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = yaml.dump_all(objects, Dumper=ManifestDumper, sort_keys=False, width=100)
    if args.render:
        print(text, end="")
        return 0
    name = job.bench_name(cr["metadata"]["name"])
    ns = cr["metadata"]["namespace"]
    proc = subprocess.run(["kubectl", "apply", "-f", "-"], input=text, text=True)
    if proc.returncode == 0:
        print(f"follow it: kubectl logs -n {ns} -f job/{name}\n"
              f"the report: kubectl logs -n {ns} job/{name} | tail -1 > report.json",
              file=sys.stderr)
    return proc.returncode


def cmd_bench(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.action == "sweep":
        return _sweep(args, out)
    if args.render or (args.file and not args.url):
        if not args.file:
            raise SystemExit("error: --render needs -f CR.yaml")
        return _render_or_create(args)
    if not args.url:
        raise SystemExit("error: give -f CR.yaml (a Job) or --url URL (run here)")
    full = run_one(args, 1, args.file[0] if args.file else None, args.url[0], out)
    from longctx_operator.bench.report import table
    print(table(full), end="", file=sys.stderr if args.emit_json else sys.stdout)
    print(f"report: {out / 'report.json'}, plot: {out / 'report.png'}", file=sys.stderr)
    if args.emit_json:
        print(json.dumps(full, separators=(",", ":")))
    failed = any(p["failures"] for p in full["points"]) or not full["points"]
    return 130 if full["interrupted"] else 1 if failed else 0
