"""The real deployment the day-two modules share (see conftest.py), and what they ask of it."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from longctx_core import contract
from tests.cluster.real_engines import RealEngines, chat, cpu_cr, http_json, words
from tests.cluster.sessions import disaggregated
from tests.cluster.traffic import is_ready
from tests.figures import Figures  # noqa: F401  (the day-two modules record through it)
from tests.conftest import wait_for
from tests.contract.variants import deep_merge

NAMESPACE = "day-two"
NAME = "day2"
MODEL = "tiny-dense"
# A window well past the longest request, so that a drain ended early shows.
DRAIN_SECONDS = 300
# Three engines start on the 2 cores at once.
READY_TIMEOUT = 600


def base_cr() -> dict[str, Any]:
    # Both prefill engines on core 0, decode on core 1 (cpu_cr's threadsBind).
    # The tiny models' 4,096 positions: test_prefix_reuse.py times new turns of up to 3,072
    # tokens on a 512-token prefix.
    cr = cpu_cr(NAME, model="dense", prefill={"replicas": 2}, maxContextTokens=4096,
                rollout={"drainSeconds": DRAIN_SECONDS})
    cr["spec"]["model"]["servedName"] = MODEL
    return cr


@dataclass
class Deployment:
    real: RealEngines
    cr_path: Path                          # the CR as applied, for `longctx bench -f`
    name: str = NAME
    namespace: str = NAMESPACE
    model: str = MODEL
    cr: dict[str, Any] = field(default_factory=base_cr)

    def __post_init__(self) -> None:
        self.cr_path.write_text(yaml.safe_dump(self.cr))

    def apply(self, edit: dict[str, Any]) -> None:
        """The CR as last applied with `edit` merged into its spec, applied: each change
        builds on those before it, whichever of them ran."""
        deep_merge(self.cr["spec"], copy.deepcopy(edit))
        self.cr_path.write_text(yaml.safe_dump(self.cr))
        self.real.apply(self.cr, self.namespace)

    def pods(self, role: str | None = None) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name}"
        pods = self.real.pods(self.namespace, selector)
        roles = (role,) if role else contract.ROLES
        return [p for p in pods
                if p["metadata"]["labels"].get(contract.COMPONENT_LABEL) in roles]

    def urls(self, role: str) -> dict[str, str]:
        """The Ready pods of `role` (an engine role or the router): {pod name: URL}."""
        port = contract.VLLM_ROUTER_PORT if role == contract.ROUTER_COMPONENT \
            else contract.SERVING_BASE_PORT
        pods = self.real.pods(self.namespace, f"app.kubernetes.io/instance={self.name},"
                                              f"{contract.COMPONENT_LABEL}={role}")
        return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{port}"
                for p in pods if is_ready(p)}

    def router(self) -> str:
        (url,) = self.urls(contract.ROUTER_COMPONENT).values()
        return url

    def endpoints(self) -> dict[str, str]:
        """The endpoint's Ready pods (the client-facing one, spec.endpoint): {pod: URL}."""
        pods = self.real.pods(self.namespace, f"app.kubernetes.io/instance={self.name},"
                                              f"{contract.COMPONENT_LABEL}="
                                              f"{contract.ENDPOINT_COMPONENT}")
        return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{contract.ENDPOINT_PORT}"
                for p in pods if is_ready(p)}

    def endpoint(self) -> str:
        """A Ready endpoint pod's URL, once the spec's replicas are Ready (what a client of
        its Service reaches: ClusterIPs lead nowhere in the harness)."""
        want = (self.cr["spec"].get("endpoint") or {}).get("replicas", 2)
        urls = wait_for(lambda: sorted(self.endpoints().values()) if len(
            self.endpoints()) >= want else None, 120, "the endpoint's pods Ready", 0.5)
        return urls[0]

    def status(self) -> dict[str, Any]:
        return self.real.lcd(self.name, self.namespace).get("status") or {}

    def events(self) -> list[str]:
        """The Events the operator posted on the CR, "reason: message", oldest first (the
        API lists them by name)."""
        out = self.real.cp.kubectl("get", "events", "-n", self.namespace, "-o", "json",
                                   "--field-selector", f"involvedObject.name={self.name}")
        items = sorted(json.loads(out.stdout)["items"], key=lambda e: (
            e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]))
        return [f"{e['reason']}: {e['message']}" for e in items]

    def settle(self, warm: bool = True, timeout: float = READY_TIMEOUT) -> None:
        """The CR Ready with every pod it wants Ready and none leaving, and vllm-router
        listing every engine. With `warm`, each decode engine has made its NIXL handshake
        with every prefill engine (one request through each pair, as the router would send
        it: the first transfer from an engine takes 20-30 s here, during which the starved
        decode can miss its probes and the router drops it), and one request is served
        through the router."""
        def settled() -> bool:
            cr = self.real.lcd(self.name, self.namespace)
            status = cr.get("status") or {}
            pods = self.pods()
            want = sum((status.get(role) or {}).get("replicas", 0) for role in contract.ROLES)
            current = status.get("observedGeneration") == cr["metadata"]["generation"]
            if not current or status.get("phase") != "Ready" or len(pods) != want \
                    or not all(map(is_ready, pods)):
                return False
            routers = self.urls(contract.ROUTER_COMPONENT)
            if len(routers) != 1:
                return False
            listed = str(http_json(f"{next(iter(routers.values()))}/list_workers"))
            return all(p["status"]["podIP"] in listed for p in pods)
        wait_for(settled, timeout, f"{self.namespace}/{self.name} to settle", 1)
        if warm:
            for decode in self.urls("decode").values():
                for i, prefill in enumerate(self.urls("prefill").values()):
                    disaggregated(prefill, decode, {
                        "model": self.model, "max_tokens": 2, "temperature": 0,
                        "messages": [{"role": "user", "content": words(40, seed=90 + i)}]})
            assert chat(self.router(), self.model, words(40, seed=99), 2)

    def pod(self, name: str) -> dict[str, Any]:
        return json.loads(self.real.cp.kubectl("get", "pod", name, "-n", self.namespace,
                                               "-o", "json").stdout)
