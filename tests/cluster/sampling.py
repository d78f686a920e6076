"""Samples what the router would route to during a rollout: the InferencePool's selector and
the Ready pods it selects, every 200 ms, through the API (tests and benchmarks/rollout.py).

A check on the samples waits for the sample it needs (`PoolSampler.until`), not for the
sampling to stop: the API server can answer later than the condition it reflects holds."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from longctx_core import contract

SAMPLE_SECONDS = 0.2


@dataclass
class Sample:
    t: float
    selected: str | None               # the pool's pairing label
    ready: dict[str, set[str]]          # role -> Ready pods the pool selects
    revisions: set[str]                 # revisions among the pods the pool selects
    pods: set[str] = field(default_factory=set)   # every engine pod of the CR
    gpus: int = 0                       # GPUs requested by the CR's scheduled engine pods


class PoolSampler(threading.Thread):
    """Reads the InferencePool and the pods it selects every 200 ms, through the API."""

    def __init__(self, namespace: str, name: str):
        super().__init__(daemon=True)
        from longctx_operator.runtime.kube import Kube
        self.kube, self.namespace, self.name = Kube.from_environment(), namespace, name
        self.samples: list[Sample] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def until(self, check: Callable[[Sample], object], timeout: float, what: str) -> Sample:
        """The first sample for which `check` holds, sampling on for up to `timeout` s until
        one does."""
        deadline = time.monotonic() + timeout
        while True:
            found = next((s for s in list(self.samples) if check(s)), None)
            if found is not None:
                return found
            if self.error is not None or not self.is_alive():
                raise AssertionError(f"sampling stopped before {what}: {self.error!r}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no sample with {what} in {timeout:.0f} s "
                                     f"({len(self.samples)} samples)")
            time.sleep(SAMPLE_SECONDS)

    def run(self) -> None:
        try:
            self._sample()
        except BaseException as exc:
            self.error = exc
            raise

    def _sample(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            pool = self.kube.get("inference.networking.k8s.io/v1", "InferencePool",
                                 self.namespace, self.name)
            selector = (pool or {}).get("spec", {}).get("selector", {}).get("matchLabels", {})
            pods = self.kube.list("v1", "Pod", self.namespace,
                                  {contract.INSTANCE_LABEL: self.name})
            chosen = [p for p in pods if selector and all(
                p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
            ready = {role: {p["metadata"]["name"] for p in chosen
                            if p["metadata"]["labels"].get(contract.COMPONENT_LABEL) == role
                            and not p["metadata"].get("deletionTimestamp")
                            and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in p.get("status", {}).get("conditions", []))}
                     for role in contract.ROLES}
            self.samples.append(Sample(
                time.monotonic(), selector.get(contract.PAIRING_LABEL), ready,
                {p["metadata"]["labels"].get(contract.PAIRING_LABEL) for p in chosen},
                {p["metadata"]["name"] for p in pods
                 if p["metadata"]["labels"].get(contract.COMPONENT_LABEL) in contract.ROLES},
                sum(int(c["resources"].get("requests", {}).get("nvidia.com/gpu", 0))
                    for p in pods if p["spec"].get("nodeName")
                    for c in p["spec"]["containers"])))
            self.stop.wait(max(SAMPLE_SECONDS - (time.monotonic() - started), 0))
