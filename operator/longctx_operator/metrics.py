"""Operator metrics (Prometheus, served on /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter("longctx_reconciles_total", "Reconciles by result.", ["result"])
RECONCILE_SECONDS = Histogram("longctx_reconcile_duration_seconds", "Reconcile duration.",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
RECONCILE_QUEUE_SECONDS = Histogram(
    "longctx_reconcile_queue_seconds",
    "Time a requested reconcile waited for a worker (rises when the API server is saturated).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
API_WRITES = Counter("longctx_api_writes_total", "API writes by kind and verb.", ["kind", "verb"])
MANAGED_OBJECTS = Gauge("longctx_managed_objects", "Child objects managed, by kind.", ["kind"])
CRS_BY_PHASE = Gauge("longctx_deployments", "LongContextDeployments by phase.", ["phase"])
ROLLOUTS_BY_PHASE = Gauge("longctx_rollouts", "LongContextDeployments by rollout phase.",
                          ["phase"])
ZERO_CAPACITY_SECONDS = Counter(
    "longctx_zero_capacity_seconds_total",
    "Seconds during which a role that should serve had no Ready pod in its serving revision.")


_serving: set[tuple[str, int]] = set()


def serve(port: int, address: str) -> None:
    """Starts the /metrics endpoint once per process (Kopf may restart the operator loop)."""
    if (address, port) not in _serving:
        start_http_server(port, addr=address)
        _serving.add((address, port))
