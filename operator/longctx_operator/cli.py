"""`longctx`: plan, render and crd work offline; `operator` runs the controller."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import zlib
from pathlib import Path

import yaml

from longctx_core.api import spec as api
from longctx_core.plan.rules import RecipeError
from longctx_core.api.schema import SpecError

from longctx_operator.bench import command as bench_command
from longctx_operator.manifests import ManifestDumper, read_manifest


def cmd_plan(args: argparse.Namespace) -> int:
    from longctx_core.sizing import hardware, performance
    from longctx_core.sizing.decider import disaggregation_report
    from longctx_core.sizing.plan_report import (render_compare, render_disaggregation,
                                                 render_decode_loss, render_performance,
                                                 render_performance_line, render_table)
    from longctx_core.sizing.planner import plan
    from longctx_operator.controller.routers import router_for

    cr = read_manifest(args.file)
    spec = api.load_spec(cr.get("spec"))
    if args.suggest:
        return _suggest(spec, args)
    if args.running:
        return _rollout(read_manifest(args.running), cr, args.output)
    capacity = plan(spec)
    try:
        profile = hardware.load_profile(args.hardware) if args.hardware else None
        if args.prompt_tokens is None:
            for flag in ("cached_tokens", "output_tokens", "concurrency", "acceptance_length"):
                if getattr(args, flag) is not None:
                    raise ValueError(f"--{flag.replace('_', '-')} needs --prompt-tokens")
            workload = None
            perf = performance.summary_at_max_context(spec, profile)
        else:
            workload = performance.Workload(
                args.prompt_tokens, args.cached_tokens or 0, args.output_tokens or 0,
                args.concurrency or 1, args.acceptance_length)
            perf = performance.predict(spec, workload, profile)
        rows = None
        if args.compare:
            rows = performance.compare(
                spec, workload or performance.Workload(spec.maxContextTokens), profile)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        decision = disaggregation_report(spec)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        out = {**capacity.to_json(), "performance": perf, "disaggregation": decision}
        if rows is not None:
            out["compare"] = rows
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        text = render_table(capacity)
        text += render_performance_line(perf) if workload is None else \
            "\n" + render_performance(perf)
        text += render_decode_loss(perf)
        router = router_for(spec)
        text += render_disaggregation(decision, spec.router.type, router.decides_disaggregation)
        if rows is not None:
            text += "\n" + render_compare(rows)
        print(text)
    return 0 if capacity.fits else 3


def _rollout(running: dict, cr: dict, output: str) -> int:
    """What applying `cr` over the `running` one does: the operator's own decision against
    the running spec's rendered StatefulSets (controller/rollout_cost.py)."""
    from longctx_core.plan.revision import pairing_changes
    from longctx_core.plan.roles import serving_plan
    from longctx_core.sizing.planner import plan as capacity_plan
    from longctx_operator.controller.builders.engine import revision_objects
    from longctx_operator.controller.replacement import plan_for_revision
    from longctx_operator.controller.rollout import group_revisions
    from longctx_operator.controller.rollout_cost import prefix_tokens_per_pod, rollout_cost
    from longctx_operator.controller.routers import router_for

    meta = {"namespace": "default", "uid": "", **cr["metadata"]}
    if running["metadata"].get("name") != meta.get("name"):
        raise SpecError(f"--from names metadata.name={running['metadata'].get('name')!r} but "
                        f"-f names {meta.get('name')!r}: compare two versions of one "
                        "LongContextDeployment")
    cr, running = {**cr, "metadata": meta}, {**running, "metadata": meta}
    before = serving_plan(api.load_spec(running.get("spec")), meta["name"])
    after = serving_plan(api.load_spec(cr.get("spec")), meta["name"])
    sets = [o for o in revision_objects(running, before, router_for(before.spec))
            if o["kind"] == "StatefulSet"]
    live = group_revisions(sets, [])[before.revision]
    same_key = before.pairing_key == after.pairing_key
    router = router_for(after.spec)
    decided, replaced = plan_for_revision(cr, after, router, live if same_key else None,
                                          True, set())
    cost = rollout_cost(cr, decided, router, live, replaced,
                        prefix_tokens_per_pod(capacity_plan(before.spec).to_json()),
                        tuple(pairing_changes(before.spec, after.spec)))
    print(json.dumps(cost.to_json(), indent=2) if output == "json" else cost.render())
    return 0


def _suggest(spec: api.LongContextDeploymentSpec, args: argparse.Namespace) -> int:
    from longctx_core.sizing.plan_report import render_table
    from longctx_core.quantity import parse_bytes
    from longctx_core.plan.suggest import suggest

    try:
        memory = None if args.node_memory is None else parse_bytes(args.node_memory,
                                                                   "--node-memory")
        found = suggest(spec, args.gpus_per_node, memory)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    if args.output == "json":
        print(json.dumps({"suggestion": found.changes, **found.plan.to_json()}, indent=2))
    else:
        print("Smallest layout that fits (set these in spec):\n"
              + yaml.safe_dump(found.changes, sort_keys=False) + "\n" + render_table(found.plan))
    return 0 if found.plan.fits else 3


def cmd_render(args: argparse.Namespace) -> int:
    from longctx_core.vllm_config.recipes import launch_document
    from longctx_core.plan.roles import serving_plan

    from longctx_operator.controller.desired import desired_objects
    from longctx_operator.controller.routers import router_for

    cr = read_manifest(args.file)
    cr["metadata"].setdefault("uid", "")
    plan = serving_plan(api.load_spec(cr.get("spec")), cr["metadata"].get("name"))
    if args.launch:
        meta = cr["metadata"]
        print(launch_document(plan.role(args.launch), 
            meta["name"], meta.get("namespace") or "default").to_json())
        return 0
    objects = desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=args.pod_monitor)
    for obj in objects:
        # Plain manifests belong to whoever applies them (a GitOps tool), not to a CR.
        obj["metadata"].pop("ownerReferences", None)
    if args.output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        print(yaml.dump_all(objects, Dumper=ManifestDumper, sort_keys=False, width=100), end="")
    return 0


def _print_or_write(text: str, paths: list[str] | None) -> int:
    """A generated file: printed, or written to each of `paths`."""
    if paths:
        for path in paths:
            Path(path).write_text(text)
    else:
        print(text, end="")
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from longctx_operator.crd import render_crd_yaml

    return _print_or_write(render_crd_yaml(), args.write)


def cmd_rbac(args: argparse.Namespace) -> int:
    from longctx_operator.rbac import render_rules_yaml

    return _print_or_write(render_rules_yaml(), args.write)


def peering_priority() -> int:
    """Distinct per replica (every container is PID 1): derived from the pod's name."""
    if os.environ.get("LONGCTX_PRIORITY"):
        return int(os.environ["LONGCTX_PRIORITY"])
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}-{os.getpid()}"
    return zlib.crc32(identity.encode()) % 1000 + 1


def cmd_operator(args: argparse.Namespace) -> int:
    import kopf

    from longctx_operator.runtime import main  # noqa: F401  (importing it registers the handlers)

    os.environ["LONGCTX_NAMESPACES"] = ",".join(args.namespace or ())
    os.environ["LONGCTX_METRICS_PORT"] = str(args.metrics_port)
    os.environ["LONGCTX_METRICS_ADDRESS"] = args.metrics_address
    kopf.configure(verbose=args.verbose)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=peering_priority(),
        liveness_endpoint=f"http://{args.health_address}:{args.health_port}/healthz",
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="longctx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="capacity plan of a LongContextDeployment (offline)")
    p.add_argument("-f", "--file", required=True, help="manifest file, or - for stdin")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--prompt-tokens", type=int, help="predict serving a prompt this long "
                   "(default: only a one-line prediction at maxContextTokens)")
    p.add_argument("--cached-tokens", type=int, help="tokens of the prompt already cached")
    p.add_argument("--output-tokens", type=int, help="tokens generated per request")
    p.add_argument("--concurrency", type=int, help="concurrent requests on decode (default 1)")
    p.add_argument("--acceptance-length", type=float, help="MTP tokens accepted per step "
                   "(default: the seed's 2.99 at 3 draft tokens, scaled per draft token)")
    p.add_argument("--hardware", metavar="FILE", help="hardware profile JSON, e.g. from "
                   "`longctx-kernels preflight --write-profile FILE` (default: H200)")
    p.add_argument("--compare", action="store_true", help="the seed's alternative layouts "
                   "(DP8 prefill, TP8, PCP without DCP, offload-only decode) on the same GPUs")
    p.add_argument("--suggest", action="store_true", help="propose the smallest prefill and "
                   "decode layouts that hold maxContextTokens on nodes of --gpus-per-node GPUs "
                   "(and --node-memory host memory)")
    p.add_argument("--from", dest="running", metavar="RUNNING", help="the spec that runs "
                   "now: print what applying -f over it does instead (which roles roll and "
                   "how, GPUs at the peak, prefill's warm prefixes lost)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="with --suggest (default 8)")
    p.add_argument("--node-memory", help="with --suggest: allocatable host memory of a node, "
                   "e.g. 2Ti (default: not checked)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("render", help="every child object as YAML (offline, like helm template)")
    p.add_argument("-f", "--file", required=True, help="manifest file, or - for stdin")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("--pod-monitor", action="store_true",
                   help="include the PodMonitors (vLLM ranks, endpoint picker)")
    p.add_argument("--launch", choices=("prefill", "decode"),
                   help="print only this role's launch document (what `longctx-engine run` "
                        "runs; try it with --dry-run)")
    p.set_defaults(func=cmd_render)

    bench_command.add_parser(sub)

    p = sub.add_parser("crd", help="print (or --write) the generated CRD")
    p.add_argument("--write", nargs="*", help="files to write instead of printing")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("rbac", help="print (or --write) the operator's generated RBAC rules")
    p.add_argument("--write", nargs="*", help="files to write instead of printing")
    p.set_defaults(func=cmd_rbac)

    p = sub.add_parser("operator", help="run the operator (Kopf)")
    p.add_argument("--namespace", action="append", help="watch only these namespaces "
                   "(repeatable); default: all")
    p.add_argument("--peering", default=None, help="Kopf peering name for leader election "
                   "between replicas; omit to run standalone")
    p.add_argument("--metrics-port", type=int, default=8080)
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--health-port", type=int, default=8081)
    p.add_argument("--health-address", default="0.0.0.0")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(func=cmd_operator)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, RecipeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
