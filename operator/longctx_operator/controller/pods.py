"""What an engine pod's status says went wrong, in words (pure): read by the CR's status
and by the rollout, which both judge the same pods; and the GPUs a pod requests."""

from __future__ import annotations

from typing import Any

from longctx_core import contract
from longctx_core.quantity import parse_bytes

# A container restarted this often (or in CrashLoopBackOff) turns the CR Degraded.
RESTARTS_DEGRADED = 3


def crash_message(pods: list[dict[str, Any]]) -> str | None:
    """The last termination of a crash-looping container of these pods, in words."""
    for pod in pods:
        statuses = pod.get("status", {})
        for cs in statuses.get("containerStatuses", []) + statuses.get("initContainerStatuses", []):
            waiting = cs.get("state", {}).get("waiting", {})
            if cs.get("restartCount", 0) < RESTARTS_DEGRADED and \
                    waiting.get("reason") != "CrashLoopBackOff":
                continue
            last = cs.get("lastState", {}).get("terminated", {})
            detail = last.get("message") or waiting.get("message") or ""
            return (f"container {cs['name']} of pod {pod['metadata']['name']} restarted "
                    f"{cs.get('restartCount', 0)} times; last exit: "
                    f"{last.get('reason', waiting.get('reason', 'unknown'))} "
                    f"(exit code {last.get('exitCode', '?')}){': ' + detail if detail else ''}")
    return None


def unschedulable_message(pods: list[dict[str, Any]]) -> str | None:
    for pod in pods:
        for cond in pod.get("status", {}).get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return f"pod {pod['metadata']['name']} cannot be scheduled: {cond.get('message', '')}"
    return None


def requested_gpus(pod_spec: dict[str, Any]) -> int:
    """The GPUs a pod (or a pod template's spec) requests, over its containers."""
    return sum(parse_bytes(str(((c.get("resources") or {}).get("requests") or {}).get(
        contract.GPU_RESOURCE, 0))) for c in pod_spec.get("containers") or [])
