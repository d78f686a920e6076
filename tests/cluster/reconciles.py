"""Evidence that the operator reconciled: its own count of finished reconciles
(`longctx_reconciles_total`, every result), read from the registry of an operator running in
this process or from an operator process's /metrics. A negative assertion ("nothing was
written", "not Ready") first waits for a reconcile that finished after the change, instead of
sleeping a fixed time and hoping one ran."""

from __future__ import annotations

from typing import Callable

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for

FAMILY = "longctx_reconciles"      # the counter, as the client names its family


def in_process() -> float:
    """Reconciles finished by the operator running in this process (Kopf's test runner)."""
    return sum(s.value for family in REGISTRY.collect() if family.name == FAMILY
               for s in family.samples if s.name == f"{FAMILY}_total")


def from_metrics(text: str) -> float:
    """Reconciles finished, from an operator process's /metrics text."""
    return sum(s.value for family in text_string_to_metric_families(text)
               if family.name == FAMILY for s in family.samples if s.name == f"{FAMILY}_total")


def wait_for_reconciles(count: Callable[[], float], since: float, what: str, n: int = 1,
                        timeout: float = 60) -> float:
    """Waits until `n` reconciles finished after the count was `since`; the new count."""
    return wait_for(lambda: (c := count()) >= since + n and c, timeout,
                    f"{n} reconcile(s) after {what}")
