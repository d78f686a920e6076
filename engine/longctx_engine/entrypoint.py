"""`longctx-engine run --role prefill|decode --config FILE [--dry-run]`: the engine container's
entrypoint.

Reads the engine config the operator mounts (/etc/longctx/engine.yaml), derives the pod's
identity from the Downward API env (POD_NAME, POD_NAMESPACE, POD_IP), builds the vLLM
command (recipes.py), runs the pre-checks (precheck.py), prints the exact command and env,
and execs `vllm serve`. With --dry-run it prints everything, pre-check results included,
and exits 0 (a failed pre-check does not fail a dry run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import shlex
import sys
from typing import Callable, Mapping, Optional, Sequence, TextIO

from .engine_config import EngineConfigError, read_engine_config
from .precheck import CheckResult, HostProbe, run_prechecks
from .contract import CONFIG_PATH, ROLES
from .identity import PodIdentity
from .recipes import EngineCommand
from .roles import serving_plan
from .rules import RecipeError


def render(cmd: EngineCommand) -> str:
    """The command as a shell script fragment: env exports, then the exact argv."""
    lines = [f"export {k}={shlex.quote(v)}" for k, v in cmd.env.items()]
    if cmd.workdir:
        for link, target in cmd.symlinks.items():
            lines.append(f"# model link: {cmd.workdir}/{link} -> {target}")
        lines.append(f"cd {shlex.quote(cmd.workdir)}")
    lines.append(shlex.join(cmd.argv))
    return "\n".join(lines)


def prepare_workdir(cmd: EngineCommand) -> None:
    """Creates the model symlinks of a PVC source and enters the work directory."""
    if not cmd.workdir:
        return
    for link, target in cmd.symlinks.items():
        path = os.path.join(cmd.workdir, link)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        os.symlink(target, path)
    os.chdir(cmd.workdir)


def child_env(cmd: EngineCommand, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    if "://" in env.get("VLLM_PORT", ""):
        env.pop("VLLM_PORT")        # a Kubernetes service link, not a port (vLLM would raise)
    env.update(cmd.env)
    return env


# The node check in the engine image (kernels/longctx_kernels/cli.py).
PREFLIGHT = [sys.executable, "-m", "longctx_kernels.cli", "preflight"]


def run(role: str, config: str, dry_run: bool = False, *,
        env: Optional[Mapping[str, str]] = None, probe: Optional[HostProbe] = None,
        out: TextIO = sys.stdout, err: TextIO = sys.stderr,
        execvpe: Callable[..., None] = os.execvpe,
        preflight: Callable[[], int] = lambda: subprocess.call(PREFLIGHT)) -> int:
    env = dict(os.environ if env is None else env)
    try:
        cfg = read_engine_config(config)
        pod = PodIdentity.from_env(cfg.cr_name, cfg.namespace, role, env, strict=not dry_run)
        plan = serving_plan(cfg.spec).role(role)
        cmd = plan.command(pod)
    except (EngineConfigError, RecipeError) as e:
        print(f"longctx-engine: {e}", file=err)
        return 2
    ports = plan.ports
    print(f"# longctx-engine: {cfg.namespace}/{cfg.cr_name} role={role} pod={pod.pod_name} "
          f"ordinal={pod.ordinal} ip={pod.pod_ip}", file=out)
    print(f"# ports: http={ports.http} supervisor={ports.supervisor} nixl={ports.nixl}",
          file=out)
    results: list[CheckResult] = run_prechecks(
        cfg.spec, role, probe or HostProbe(env=env))
    for r in results:
        print(f"# precheck {r.line()}", file=out)
    print(render(cmd), file=out)
    out.flush()
    failed = [r for r in results if not r.ok]
    if cfg.spec.engine.preflight:
        print(f"# preflight: {' '.join(PREFLIGHT)}", file=out)
    if dry_run:
        if failed:
            print(f"# dry run: {len(failed)} pre-check(s) would stop a real start", file=out)
        return 0
    if failed:
        for r in failed:
            print(f"longctx-engine: pre-check failed: {r.name}: {r.message}", file=err)
        return 1
    if cfg.spec.engine.preflight:
        out.flush()
        code = preflight()
        if code != 0:
            print(f"longctx-engine: the node failed `{' '.join(PREFLIGHT)}` (exit {code}); its "
                  "table above says which check. Drain the node, or set "
                  "spec.engine.preflight to false to start anyway.", file=err)
            return 1
    prepare_workdir(cmd)
    execvpe(cmd.argv[0], cmd.argv, child_env(cmd, env))
    return 0  # only reached with a test double


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="longctx-engine",
                                     description="Runs a longctx prefill or decode vLLM engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="build the vLLM command for this pod, check the host, exec it")
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--config", default=CONFIG_PATH,
                   help=f"engine config (default {CONFIG_PATH}); a LongContextDeployment "
                        "manifest or its ConfigMap also works")
    p.add_argument("--dry-run", action="store_true",
                   help="print the command, env and pre-check results, then exit 0")
    args = parser.parse_args(argv)
    return run(args.role, args.config, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
