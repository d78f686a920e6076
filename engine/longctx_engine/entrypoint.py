"""`longctx-engine run LAUNCH_DOCUMENT [--dry-run]`: the engine container's entrypoint.

Reads the launch document the operator rendered for this pod's role
(/etc/longctx/<role>.json, launch.py), fills its placeholders from the Downward API env
(POD_NAME, POD_IP), runs the host checks (precheck.py), prints the exact command and env,
and execs it. With --dry-run it prints everything, check results included, and exits 0 (a
failed check does not fail a dry run). It computes nothing about the deployment: what runs
is what the operator rendered.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, TextIO

from longctx_core.contract import ENV_POD_IP, ENV_POD_NAME
from longctx_engine import modelinfo
from longctx_core.launch import Launch, LaunchDocument, LaunchError, fill, parse
from longctx_engine.precheck import CheckResult, HostProbe, run_prechecks


def render(doc: LaunchDocument, launch: Launch) -> str:
    """The command as a shell script fragment: env exports, then the exact argv."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
    if doc.workdir:
        for link, target in doc.model_links.items():
            lines.append(f"# model link: {doc.workdir}/{link} -> {target}")
        lines.append(f"cd {shlex.quote(doc.workdir)}")
    lines.append(shlex.join(launch.argv))
    return "\n".join(lines)


def prepare_workdir(doc: LaunchDocument) -> None:
    """Creates the model symlinks of a PVC source and enters the work directory."""
    if not doc.workdir:
        return
    for link, target in doc.model_links.items():
        path = os.path.join(doc.workdir, link)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        os.symlink(target, path)
    os.chdir(doc.workdir)


def child_env(launch: Launch, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    if "://" in env.get("VLLM_PORT", ""):
        env.pop("VLLM_PORT")        # a Kubernetes service link, not a port (vLLM would raise)
    env.update(launch.env)
    return env


# The node check in the engine image (kernels/longctx_kernels/cli.py).
PREFLIGHT = [sys.executable, "-m", "longctx_kernels.cli", "preflight"]


def _pod(env: Mapping[str, str], dry_run: bool, doc: LaunchDocument) -> tuple[str, str]:
    missing = [k for k in (ENV_POD_NAME, ENV_POD_IP) if not env.get(k)]
    if missing and not dry_run:
        raise LaunchError(
            f"environment variable(s) {', '.join(missing)} are not set: the engine container "
            f"needs {ENV_POD_NAME} (fieldRef metadata.name) and {ENV_POD_IP} (fieldRef "
            "status.podIP) from the Downward API; the NIXL side channel must advertise the "
            "pod IP")
    # A dry run outside a pod shows pod 0 on loopback.
    return (env.get(ENV_POD_NAME) or f"{doc.deployment}-{doc.role}-0",
            env.get(ENV_POD_IP) or "127.0.0.1")


def run(document: str, dry_run: bool = False, *,
        env: Optional[Mapping[str, str]] = None, probe: Optional[HostProbe] = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr,
        execvpe: Callable[..., None] = os.execvpe,
        preflight: Callable[[], int] = lambda: subprocess.call(PREFLIGHT)) -> int:
    env = dict(os.environ if env is None else env)
    try:
        doc = parse(Path(document).read_text(), document)
        pod_name, pod_ip = _pod(env, dry_run, doc)
        launch = fill(doc, pod_name, pod_ip)
    except OSError as e:
        print(f"longctx-engine: cannot read launch document {document}: "
              f"{e.strerror or e}", file=err)
        return 2
    except LaunchError as e:
        print(f"longctx-engine: {e}", file=err)
        return 2
    print(f"# longctx-engine: {doc.namespace}/{doc.deployment} role={doc.role} pod={pod_name} "
          f"ip={pod_ip} launch format {doc.format_version}", file=out)
    results: list[CheckResult] = run_prechecks(doc, probe or HostProbe(env=env))
    for r in results:
        print(f"# precheck {r.line()}", file=out)
    print(render(doc, launch), file=out)
    out.flush()
    failed = [r for r in results if not r.ok]
    if doc.preflight:
        print(f"# preflight: {' '.join(PREFLIGHT)}", file=out)
    if dry_run:
        if failed:
            print(f"# dry run: {len(failed)} pre-check(s) would stop a real start", file=out)
        return 0
    if failed:
        for r in failed:
            print(f"longctx-engine: pre-check failed: {r.name}: {r.message}", file=err)
        return 1
    if doc.preflight:
        out.flush()
        code = preflight()
        if code != 0:
            print(f"longctx-engine: the node failed `{' '.join(PREFLIGHT)}` (exit {code}); its "
                  "table above says which check. Drain the node, or set "
                  "spec.engine.preflight to false to start anyway.", file=err)
            return 1
    prepare_workdir(doc)
    engine_env = child_env(launch, env)
    seeded = modelinfo.seed(engine_env)
    if seeded:
        print(f"# vLLM model-info cache: {', '.join(seeded)} from the image", file=out)
        out.flush()
    execvpe(launch.argv[0], launch.argv, engine_env)
    return 0  # only reached with a test double


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="longctx-engine",
                                     description="Runs a longctx prefill or decode vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="fill the launch document for this pod, check the host, "
                                   "exec it")
    p.add_argument("document", help="the launch document the operator rendered "
                                    "(/etc/longctx/<role>.json in the pod; `longctx render "
                                    "--launch ROLE` writes it offline)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command, env and pre-check results, then exit 0")
    args = parser.parse_args(argv)
    return run(args.document, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
