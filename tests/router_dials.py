"""Every address a component of a deployment dials, and where its server listens, read from the
objects the operator renders (`longctx render`): the engines' launch documents, the decode
sidecar's flags, the picker's and vllm-router's flags, the pods' active-ports annotations.

`check(cr)` lists the dials that no listener answers (a server bound to the pod IP that a
client dials on loopback, a port nobody serves). The tables in docs/router.md are `table()`
of the examples; `python -m tests.router_dials --write` regenerates them, and
tests/operator/test_router_dials.py fails when they differ from the rendering.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.launch import parse
from longctx_core.plan.roles import serving_plan

from longctx_operator.controller.builders.router import SIDECAR_NAME
from longctx_operator.controller.desired import desired_objects
from longctx_operator.controller.routers import router_for

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "router.md"
EVERY_ADDRESS, POD_IP, LOOPBACK = "every address of the pod", "pod IP", "loopback"
# The examples whose dials docs/router.md lists, and the router each is rendered with.
EXAMPLES = (("glm-5.3-1m.yaml", "llm-d"), ("tiny-mla-cpu.yaml", "vllm-router"),
            ("tiny-mla-cpu.yaml", "llm-d"))


@dataclass(frozen=True)
class Listener:
    server: str
    host: str              # EVERY_ADDRESS, POD_IP or LOOPBACK
    ports: tuple[int, ...]


@dataclass(frozen=True)
class Dial:
    client: str
    server: str
    host: str              # POD_IP (the server's pod) or LOOPBACK (the client's own pod)
    ports: tuple[int, ...]


def host_kind(host: str | None) -> str:
    if host in (None, "", "0.0.0.0", "::", "[::]"):
        return EVERY_ADDRESS
    if host in ("127.0.0.1", "::1", "localhost"):
        return LOOPBACK
    if re.fullmatch(r"\$[({]" + contract.ENV_POD_IP + r"[)}]", host):
        return POD_IP
    raise ValueError(f"host {host!r}: not a pod's address")


def answers(listener: Listener, dial: Dial) -> bool:
    return listener.server == dial.server and set(dial.ports) <= set(listener.ports) and \
        listener.host in (EVERY_ADDRESS, dial.host)


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _span(first: int, count: int) -> tuple[int, ...]:
    return tuple(range(first, first + count))


def rendered(cr: dict[str, Any]) -> list[dict[str, Any]]:
    cr = json.loads(json.dumps(cr))
    cr["metadata"].setdefault("uid", "")
    cr["metadata"].setdefault("namespace", "default")
    plan = serving_plan(api.load_spec(cr["spec"]), cr["metadata"]["name"])
    return desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=False)


def engine(role: str) -> str:
    return f"{role} vLLM"


def nixl(role: str) -> str:
    return f"{role} NIXL side channel"


SIDECAR, ROUTER, PICKER = "decode routing sidecar", "vllm-router", "endpoint picker"
# Clients from outside the deployment's pods.
CLIENTS, GATEWAY = "the deployment's clients", "the gateway (ext_proc)"
KUBELET, PROMETHEUS = "the kubelet (gRPC probes)", "Prometheus"


def addresses(objects: list[dict[str, Any]]) -> tuple[list[Listener], list[Dial]]:
    """What listens where and what dials where, from the rendered objects alone."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    listeners: list[Listener] = []
    dials: list[Dial] = []
    pool_ports: dict[str, tuple[int, ...]] = {}    # role -> ports its pods serve to the router
    served_by: dict[str, str] = {}                 # role -> the server on those ports
    for sts in by_kind.get("StatefulSet", []):
        template = sts["spec"]["template"]
        role = template["metadata"]["labels"][contract.COMPONENT_LABEL]
        annotations = template["metadata"].get("annotations") or {}
        sidecars = {c["name"]: c for c in template["spec"].get("initContainers") or []}
        if SIDECAR_NAME in sidecars:
            args = sidecars[SIDECAR_NAME]["args"]
            ranks = int(_flag(args, "--data-parallel-size") or 1)
            listeners.append(Listener(SIDECAR, host_kind(None),
                                      _span(int(_flag(args, "--port")), ranks)))
            dials.append(Dial(SIDECAR, engine(role), host_kind(contract.SIDECAR_MODEL_SERVER_HOST),
                              _span(int(_flag(args, "--model-server-port")), ranks)))
            served_by[role] = SIDECAR
        else:
            served_by[role] = engine(role)
        if contract.ACTIVE_PORTS_ANNOTATION in annotations:
            pool_ports[role] = tuple(int(p) for p in
                                     annotations[contract.ACTIVE_PORTS_ANNOTATION].split(","))
    for config in by_kind.get("ConfigMap", []):
        for role in contract.ROLES:
            text = (config.get("data") or {}).get(contract.launch_key(role))
            if text is None:
                continue
            doc = parse(text)
            ranks = doc.ranks_per_pod
            listeners.append(Listener(engine(role), host_kind(_flag(doc.argv, "--host")),
                                      _span(int(_flag(doc.argv, "--port")), ranks)))
            listeners.append(Listener(nixl(role), host_kind(doc.env[contract.ENV_NIXL_HOST]),
                                      _span(doc.nixl_base_port, ranks)))
    if any(listener.server == nixl("prefill") for listener in listeners):
        prefill_nixl = next(x for x in listeners if x.server == nixl("prefill"))
        dials.append(Dial(engine("decode"), nixl("prefill"), POD_IP, prefill_nixl.ports))
    if SIDECAR in served_by.values() and "prefill" in pool_ports:
        dials.append(Dial(SIDECAR, served_by["prefill"], POD_IP, pool_ports["prefill"]))
    for dep in by_kind.get("Deployment", []):
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        component = dep["spec"]["template"]["metadata"]["labels"][contract.COMPONENT_LABEL]
        args = container.get("args") or []
        if component != contract.ROUTER_COMPONENT:
            continue
        if "--service-discovery-port" in args:
            port = int(_flag(args, "--service-discovery-port"))
            listeners.append(Listener(ROUTER, host_kind(_flag(args, "--host")),
                                      (int(_flag(args, "--port")),)))
            listeners.append(Listener(f"{ROUTER} metrics",
                                      host_kind(_flag(args, "--prometheus-host")),
                                      (int(_flag(args, "--prometheus-port")),)))
            dials += [Dial(ROUTER, served_by[role], POD_IP, (port,)) for role in contract.ROLES]
            dials += [Dial(CLIENTS, ROUTER, POD_IP, (int(_flag(args, "--port")),)),
                      Dial(PROMETHEUS, f"{ROUTER} metrics", POD_IP,
                           (int(_flag(args, "--prometheus-port")),))]
        else:
            ports = {name: int(_flag(args, f"--{name}-port"))
                     for name in ("grpc", "grpc-health", "metrics")}
            listeners.append(Listener(PICKER, EVERY_ADDRESS, tuple(sorted(ports.values()))))
            dials += [Dial(PICKER, served_by[role], POD_IP, pool_ports[role])
                      for role in contract.ROLES if role in pool_ports]
            dials += [Dial(GATEWAY, PICKER, POD_IP, (ports["grpc"],)),
                      Dial(KUBELET, PICKER, POD_IP, (ports["grpc-health"],)),
                      Dial(PROMETHEUS, PICKER, POD_IP, (ports["metrics"],))]
    return listeners, dials


def unanswered(objects: list[dict[str, Any]]) -> list[Dial]:
    listeners, dials = addresses(objects)
    return [d for d in dials if not any(answers(x, d) for x in listeners)]


# ---------------------------------------------------------------- docs/router.md


def _ports(ports: tuple[int, ...]) -> str:
    if len(ports) > 1 and ports == _span(ports[0], len(ports)):
        return f"{ports[0]}-{ports[-1]}"
    return ", ".join(map(str, ports))


def table(cr: dict[str, Any]) -> str:
    listeners, dials = addresses(rendered(cr))
    where = {x.server: f"{x.host}, {_ports(x.ports)}" for x in listeners}
    lines = ["| client | dials | on | its server listens on |", "| --- | --- | --- | --- |"]
    for d in dials:
        lines.append(f"| {d.client} | {d.server} | {d.host}, {_ports(d.ports)} | "
                     f"{where.get(d.server, 'nothing')} |")
    return "\n".join(lines)


def example(name: str, router_type: str) -> dict[str, Any]:
    cr = yaml.safe_load((REPO / "examples" / name).read_text())
    cr["spec"].setdefault("router", {})["type"] = router_type
    return cr


def section() -> str:
    parts = []
    for name, router_type in EXAMPLES:
        parts.append(f"`examples/{name}` with `spec.router.type: {router_type}`:\n\n"
                     + table(example(name, router_type)))
    return "\n\n".join(parts)


BEGIN, END = "<!-- dials:begin -->", "<!-- dials:end -->"


def doc_with_section(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{section()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="rewrite the tables in docs/router.md")
    args = p.parse_args(argv)
    text = DOC.read_text()
    if BEGIN not in text:
        print(f"{DOC}: no {BEGIN} marker", file=sys.stderr)
        return 1
    new = doc_with_section(text)
    if args.write:
        DOC.write_text(new)
    else:
        print(section())
    return 0


if __name__ == "__main__":
    sys.exit(main())
