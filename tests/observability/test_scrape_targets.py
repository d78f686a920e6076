"""Every metrics endpoint longctx scrapes, listed from the rendered objects (the operator's
children for each example, the chart through the real helm) and followed to the container
port that serves it: a PodMonitor's endpoint to a pod template's named port, a
ServiceMonitor's to a Service port, its targetPort and the selected pods' container port.
Each target must be the port its process listens on: vLLM's rank ports (the contract tests
prove vLLM's own launcher gives rank i `--port` + i), the picker's and the operator's
`--metrics-port`."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.plan.roles import serving_plan
from tests.engine_pods import Pod, pod_command
from longctx_operator.controller.routers import router_for
from longctx_operator.controller.builders import endpoint as endpoint_builder
from longctx_operator.controller.desired import desired_objects
from tests.helm.chart import by_kind, documents, helm_binary, template_text

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
CHART_NAMESPACE = "longctx-system"


@dataclass(frozen=True)
class Target:
    monitor: str       # Kind/name of the PodMonitor or ServiceMonitor
    workload: str      # Kind/name of the StatefulSet or Deployment whose pods serve it
    container: str
    port: int
    path: str


def _pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] in ("StatefulSet", "Deployment"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _container_port(template: dict[str, Any], port: str | int) -> list[tuple[str, int]]:
    """(container, number) of the named (or numbered) container port of a pod template."""
    return [(c["name"], p["containerPort"]) for c in _containers(template)
            for p in c.get("ports", []) if port in (p.get("name"), p["containerPort"])]


def pod_monitor_targets(monitor: dict[str, Any], objects: list[dict[str, Any]]) -> list[Target]:
    name = f"PodMonitor/{monitor['metadata']['name']}"
    selected = [(w, t) for w, t in _pod_templates(objects)
                if _selects(monitor["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])]
    assert selected, f"{name} selects no pod template"
    out = []
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        hits = [Target(name, w, c, n, endpoint["path"])
                for w, t in selected for c, n in _container_port(t, endpoint["port"])]
        assert hits, f"{name}: port {endpoint['port']} is no container port of its pods"
        out += hits
    return out


def service_monitor_targets(monitor: dict[str, Any], objects: list[dict[str, Any]]
                            ) -> list[Target]:
    name = f"ServiceMonitor/{monitor['metadata']['name']}"
    namespaces = monitor["spec"].get("namespaceSelector", {}).get(
        "matchNames", [monitor["metadata"]["namespace"]])
    services = [s for s in objects if s["kind"] == "Service"
                and s["metadata"]["namespace"] in namespaces
                and _selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert services, f"{name} selects no Service"
    out = []
    for endpoint in monitor["spec"]["endpoints"]:
        for svc in services:
            (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
            pods = [(w, t) for w, t in _pod_templates(objects)
                    if _selects(svc["spec"]["selector"], t["metadata"]["labels"])]
            hits = [Target(name, w, c, n, endpoint["path"]) for w, t in pods
                    for c, n in _container_port(t, port.get("targetPort", port["port"]))]
            assert hits, f"{name}: Service {svc['metadata']['name']} port {endpoint['port']} " \
                         "reaches no container port"
            out += hits
    return out


def _flag(container: dict[str, Any], flag: str) -> str:
    argv = container.get("command", []) + container.get("args", [])
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}=")]
    return value


def _manifest(name: str) -> dict[str, Any]:
    (cr,) = [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]
    cr["metadata"].setdefault("namespace", "default")
    cr["metadata"]["uid"] = "uid"
    return cr


def operator_targets(cr: dict[str, Any]) -> tuple[list[Target], list[dict[str, Any]]]:
    plan = serving_plan(api.load_spec(cr["spec"]), cr["metadata"]["name"])
    objects = desired_objects(cr, plan, router_for(plan.spec), with_pod_monitor=True)
    targets = [t for o in objects if o["kind"] == "PodMonitor"
               for t in pod_monitor_targets(o, objects)]
    return targets, objects


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_vllm_rank_of_both_roles_and_the_picker_are_scraped(name):
    cr = _manifest(name)
    cr_name = cr["metadata"]["name"]
    plan = serving_plan(api.load_spec(cr["spec"]), cr_name)
    targets, objects = operator_targets(cr)
    workloads = {w: t for w, t in _pod_templates(objects)}
    expected = set()
    for role in plan.roles:
        workload = f"StatefulSet/{contract.statefulset(cr_name, role.role, role.revision)}"
        engine = next(c for c in _containers(workloads[workload])
                      if c["name"] == contract.ENGINE_CONTAINER)
        argv = pod_command(role, _first_pod(cr, workload)).argv
        # The engine's --port is rank 0's; vLLM's supervisor gives rank i --port + i.
        assert int(argv[argv.index("--port") + 1]) == role.ports.http[0]
        assert {p["containerPort"] for p in engine["ports"]} >= set(role.ports.http)
        expected |= {Target(f"PodMonitor/{contract.pod_monitor(cr_name)}", workload,
                            contract.ENGINE_CONTAINER, port, "/metrics")
                     for port in role.ports.http}
    if plan.spec.router.type == "vllm-router":
        router = f"Deployment/{contract.vllm_router(cr_name)}"
        (container,) = _containers(workloads[router])
        port = int(container["args"][container["args"].index("--prometheus-port") + 1])
        assert port == contract.VLLM_ROUTER_METRICS_PORT
        expected.add(Target(f"PodMonitor/{contract.vllm_router(cr_name)}", router,
                            container["name"], port, "/metrics"))
    else:
        picker = f"Deployment/{contract.picker(cr_name)}"
        (epp,) = _containers(workloads[picker])
        expected.add(Target(f"PodMonitor/{contract.picker(cr_name)}", picker, epp["name"],
                            int(_flag(epp, "--metrics-port")), "/metrics"))
        assert int(_flag(epp, "--metrics-port")) == contract.PICKER_METRICS_PORT
    if endpoint_builder.deployed(plan.spec):
        endpoint = f"Deployment/{contract.endpoint(cr_name)}"
        (container,) = _containers(workloads[endpoint])
        expected.add(Target(f"PodMonitor/{contract.endpoint(cr_name)}", endpoint,
                            container["name"], contract.ENDPOINT_PORT, "/metrics"))
    # Exactly these: not the DP supervisor, not the routing sidecar (its /metrics is vLLM's,
    # proxied, and llm-d-router v0.10's sidecar serves none of its own).
    assert set(targets) == expected
    assert len(targets) == len(expected), "a port is scraped twice"


def _first_pod(cr: dict[str, Any], workload: str) -> Pod:
    """Pod 0 of a workload ("StatefulSet/<name>")."""
    return Pod(cr["metadata"]["name"], cr["metadata"]["namespace"],
               contract.pod(workload.split("/", 1)[1], 0), "0.0.0.0")


def test_no_picker_monitor_without_the_router():
    cr = copy.deepcopy(_manifest("glm-5.3-1m.yaml"))
    cr["spec"]["router"] = {"enabled": False}
    targets, objects = operator_targets(cr)
    assert {t.monitor for t in targets} == {f"PodMonitor/{contract.pod_monitor('glm')}"}
    assert not [o for o in objects if o["kind"] == "Deployment"]


def test_the_charts_service_monitor_reaches_the_operators_metrics_port(tmp_path):
    helm = helm_binary()
    objects = documents(template_text(helm, tmp_path, {"metrics.serviceMonitor.enabled": True},
                                      namespace=CHART_NAMESPACE))
    (monitor,) = by_kind(objects)["ServiceMonitor"]
    targets = service_monitor_targets(monitor, objects)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    port = int(_flag(operator, "--metrics-port"))
    assert targets == [Target(f"ServiceMonitor/{monitor['metadata']['name']}",
                              f"Deployment/{deployment['metadata']['name']}", operator["name"],
                              port, "/metrics")]
