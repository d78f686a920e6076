"""Faults on the data path, from evidence the operator already reads, and what clients saw.

Two sources:
- each engine pod's status: an engine container that exited and was restarted (its last
  termination's reason, exit code and time);
- each engine rank's vLLM `/metrics`, read every few seconds off the reconcile thread
  (runtime/engine_watch.py): NIXL transfers that failed, notifications that failed, and KV
  that prefill freed before decode read it (its lease expired). A counter that grows between
  two reads is a fault at the second read.

A fault is reported once, as a Warning Event naming the pod, the fault and what the
deployment's clients saw, and the `DataPathHealthy` condition stays False until no fault has
been seen for FAULT_HOLD_SECONDS. What clients saw is what the real-engine tests measured
through vllm-router on the CPU platform (docs/reliability.md): vLLM ends a request whose KV
cannot be read with an `error` object inside its HTTP 200 stream (`kv_load_failure_policy`
fail) or recomputes its prompt on decode (recompute); a decode engine that dies mid-answer
leaves its streams ended with neither an error nor a `finish_reason`.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from longctx_core import contract

# The condition stays False this long after the last fault: long enough to be read.
FAULT_HOLD_SECONDS = 300.0
CONDITION = "DataPathHealthy"
HEALTHY = "NoRecentFault"
# vLLM's NIXL counters (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py), by the
# fault each counts.
FAILURE_COUNTERS = {
    "vllm:nixl_num_failed_transfers_total": "KVTransferFailed",
    "vllm:nixl_num_failed_notifications_total": "KVNotificationFailed",
    "vllm:nixl_num_kv_expired_reqs_total": "KVLeaseExpired",
    "vllm:nixl_num_notifications_after_expiry_total": "KVReadAfterExpiry",
}


@dataclass(frozen=True)
class Fault:
    key: str                 # one occurrence: reported once
    pod: str
    reason: str              # EngineRestarted, KVTransferFailed, KVNotificationFailed, ...
    at: datetime.datetime
    message: str             # what happened and what the clients saw


def _parse_time(text: Optional[str]) -> Optional[datetime.datetime]:
    if not text:
        return None
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc)


def _role(pod: dict[str, Any]) -> str:
    return (pod["metadata"].get("labels") or {}).get(contract.COMPONENT_LABEL, "")


def clients_saw(reason: str, role: str, policy: str) -> str:
    """What the deployment's clients saw of a fault, in words."""
    if reason == "EngineRestarted" and role == "decode":
        return ("the answers it was streaming stopped without an error event or a "
                "finish_reason (HTTP 200): a client that checks finish_reason sees them cut "
                "off; new requests went to the other decode pods, or got HTTP 503 from "
                "vllm-router while none was Ready")
    if reason == "EngineRestarted":
        return ("requests whose KV decode had not read yet "
                + ("ended with an error event in their stream and no token"
                   if policy == "fail" else "were recomputed on decode (slower, no error)")
                + "; new requests went to the other prefill pods, or got HTTP 503 from "
                  "vllm-router while none was Ready")
    if reason in ("KVLeaseExpired", "KVReadAfterExpiry"):
        return ("decode read KV that prefill had already freed, and the client got a whole "
                "answer with no error (its tokens may be wrong): raise the KV lease "
                "(the performance model's longest step) or look for a stalled decode")
    if policy == "fail":
        return "each such request ended with an error event in its HTTP 200 stream and no token"
    return "decode recomputed each such prompt itself (slower, no error)"


def restarted(pods: Iterable[dict[str, Any]], now: datetime.datetime, policy: str
              ) -> list[Fault]:
    """Engine containers of pods that are not being deleted that exited within
    FAULT_HOLD_SECONDS (the kubelet restarts them): the exit the container is in now, or
    the one before its last restart."""
    out = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp"):
            continue   # a pod stopped on purpose (a rollout, a scale-down)
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("state"), cs.get("lastState")):
                ended = (state or {}).get("terminated") or {}
                at = _parse_time(ended.get("finishedAt"))
                if at is None or (now - at).total_seconds() > FAULT_HOLD_SECONDS:
                    continue
                how = f"{ended.get('reason', 'exited')}, exit code {ended.get('exitCode', '?')}"
                out.append(Fault(
                    key=f"{pod['metadata'].get('uid', name)}/{cs['name']}/{ended['finishedAt']}",
                    pod=name, reason="EngineRestarted", at=at,
                    message=f"the {_role(pod)} engine of pod {name} exited ({how}) at "
                            f"{ended['finishedAt']}; the kubelet restarts it: "
                            + clients_saw("EngineRestarted", _role(pod), policy)))
    return out


@dataclass(frozen=True)
class Growth:
    """A fault counter of an engine pod that grew between two reads (engine_watch.py)."""

    pod: str
    role: str
    metric: str
    grew_by: float
    at: datetime.datetime

    def fault(self, policy: str) -> Fault:
        reason = FAILURE_COUNTERS[self.metric]
        what = {"KVTransferFailed": "KV transfers failed",
                "KVNotificationFailed": "NIXL notifications to prefill failed",
                "KVLeaseExpired": "requests' KV expired on prefill before decode read it",
            "KVReadAfterExpiry": "KV reads arrived after prefill's lease expired"}[reason]
        return Fault(key=f"{self.pod}/{self.metric}/{self.at.isoformat()}", pod=self.pod,
                     reason=reason, at=self.at,
                     message=f"{self.grew_by:.0f} {what} on {self.role} pod {self.pod} "
                             f"({self.metric} +{self.grew_by:.0f}, read at "
                             f"{self.at.strftime('%Y-%m-%dT%H:%M:%SZ')}): "
                             + clients_saw(reason, self.role, policy))


class Recorded:
    """The counters the engine watch saw grow, by CR, kept FAULT_HOLD_SECONDS; and which
    faults have been reported (an Event posted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._growths: dict[tuple[str, str], list[Growth]] = {}
        self._reported: dict[tuple[str, str], set[str]] = {}

    def add(self, cr: tuple[str, str], growth: Growth) -> None:
        with self._lock:
            self._growths.setdefault(cr, []).append(growth)

    def recent(self, cr: tuple[str, str], now: datetime.datetime) -> list[Growth]:
        with self._lock:
            kept = [g for g in self._growths.get(cr, [])
                    if (now - g.at).total_seconds() <= FAULT_HOLD_SECONDS]
            self._growths[cr] = kept
            return list(kept)

    def unreported(self, cr: tuple[str, str], faults: list[Fault]) -> list[Fault]:
        """The faults not reported yet, marked reported; only the current ones are kept."""
        with self._lock:
            seen = self._reported.get(cr, set())
            new = [f for f in faults if f.key not in seen]
            self._reported[cr] = {f.key for f in faults}
            return new

    def forget(self, cr: tuple[str, str]) -> None:
        with self._lock:
            self._growths.pop(cr, None)
            self._reported.pop(cr, None)


RECORDED = Recorded()


def condition(faults: list[Fault], now: datetime.datetime) -> tuple[dict[str, str], Optional[float]]:
    """The DataPathHealthy condition (type, status, reason, message) and the seconds until
    it turns True again (None when it is True)."""
    if not faults:
        return {"type": CONDITION, "status": "True", "reason": HEALTHY,
                "message": f"no data-path fault in the last {FAULT_HOLD_SECONDS:.0f} s"}, None
    last = max(faults, key=lambda f: f.at)
    more = f" ({len(faults) - 1} more in the last {FAULT_HOLD_SECONDS:.0f} s)" \
        if len(faults) > 1 else ""
    until = FAULT_HOLD_SECONDS - (now - last.at).total_seconds()
    return {"type": CONDITION, "status": "False", "reason": last.reason,
            "message": last.message + more}, max(until, 0.0) + 1
