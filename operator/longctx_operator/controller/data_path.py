"""Faults on the data path, from evidence the operator already reads, and what clients saw.

Two sources:
- each engine pod's status: an engine container that exited and was restarted (its last
  termination's reason, exit code and time);
- each engine rank's vLLM `/metrics`, read every few seconds off the reconcile thread
  (runtime/engine_watch.py): NIXL transfers that failed, notifications that failed, KV
  that prefill freed unread when its lease expired, and reads that finished after it. A
  counter that grows between two reads of the same engine is a fault at the second read;
  a fault counter or in-flight gauge a rank does not export at all is a fault of its own
  (MissingSeries), since the operator cannot see that rank's faults or load.

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
# fault each counts. vLLM registers them at engine start, at 0, on every engine with a KV
# connector.
FAILURE_COUNTERS = {
    "vllm:nixl_num_failed_transfers_total": "KVTransferFailed",
    "vllm:nixl_num_failed_notifications_total": "KVNotificationFailed",
    "vllm:nixl_num_kv_expired_reqs_total": "KVLeaseExpired",
    "vllm:nixl_num_notifications_after_expiry_total": "KVReadAfterExpiry",
}
# vLLM counts a failed notification in the failed transfers too: a transfer fault is the
# rest of that counter's growth.
COUNTED_WITHIN = {"vllm:nixl_num_failed_transfers_total":
                  "vllm:nixl_num_failed_notifications_total"}
# What each counter counts, for the fault's message (vLLM's help text and the chart's alerts).
COUNTS = {
    "KVTransferFailed": "KV reads over NIXL (or their handshakes) failed",
    "KVNotificationFailed": "decode read a request's KV but could not tell prefill it was "
                            "done, so prefill holds the blocks until their lease expires",
    "KVLeaseExpired": "prefilled requests' KV was not read by any decode engine within the "
                      "KV lease (kv_lease_duration), so prefill freed the blocks",
    "KVReadAfterExpiry": "decode finished reading KV blocks whose lease had already expired "
                         "on prefill, which may have reused them by then",
}


@dataclass(frozen=True)
class Fault:
    key: str                 # one occurrence: reported once
    pod: str
    reason: str              # EngineRestarted, KVTransferFailed, KVNotificationFailed, ...
    at: datetime.datetime
    message: str             # what happened and what the clients saw
    standing: bool = False   # holds while its cause lasts, not FAULT_HOLD_SECONDS


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
    if reason == "KVNotificationFailed":
        return ("the answers were whole (decode had the KV); prefill's KV memory stays "
                "taken until the lease expires, which may then count as KVLeaseExpired")
    if reason == "KVLeaseExpired":
        return ("no client is told by this count alone: those requests' decode legs never "
                "read their KV (a decode engine died, stalled or queued them too long), and "
                "a late read shows as KVReadAfterExpiry; look at the decode pods' restarts "
                "and queue")
    if reason == "KVReadAfterExpiry":
        return ("those answers may be built on another request's KV, with no error to the "
                "client: raise the KV lease (the performance model's longest step) or "
                "relieve the decode pods")
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
        return Fault(key=f"{self.pod}/{self.metric}/{self.at.isoformat()}", pod=self.pod,
                     reason=reason, at=self.at,
                     message=f"{self.metric} +{self.grew_by:.0f} on {self.role} pod "
                             f"{self.pod} (read at {self.at.strftime('%Y-%m-%dT%H:%M:%SZ')})"
                             f": {COUNTS[reason]}; " + clients_saw(reason, self.role, policy))


def growths(pod: str, role: str, before: dict[str, float], after: dict[str, float],
            at: datetime.datetime) -> list[Growth]:
    """The fault counters that grew from `before` to `after` (one engine's reads), a
    counter that holds another's counts less that one's growth."""
    grew = {m: after[m] - before.get(m, 0.0) for m in after if after[m] > before.get(m, 0.0)}
    for metric, within in COUNTED_WITHIN.items():
        if metric in grew:
            grew[metric] -= grew.get(within, 0.0)
    return [Growth(pod, role, m, by, at) for m, by in grew.items() if by > 0]


@dataclass(frozen=True)
class MissingSeries:
    """A series the operator reads that an engine rank or an endpoint pod does not export
    (engine_watch.py): the operator cannot see what it counts there."""

    pod: str
    uid: str
    port: int
    series: str
    since: datetime.datetime

    def fault(self) -> Fault:
        if self.series in FAILURE_COUNTERS:
            what = (f"the {FAILURE_COUNTERS[self.series]} faults it counts there (a vLLM "
                    "that renamed it, or an engine without the NIXL connector)")
        elif self.series.startswith("vllm:"):
            what = "the requests it holds, which a drain waits for (a vLLM that renamed it)"
        else:
            what = ("the answers it continued or gave up (an endpoint image of another "
                    "version)")
        return Fault(key=f"{self.uid}/{self.port}/{self.series}", pod=self.pod,
                     reason="MissingSeries", at=self.since, standing=True,
                     message=f"pod {self.pod} exports no {self.series} on port {self.port}: "
                             f"the operator cannot see {what}")


class Recorded:
    """The counters the engine watch saw grow, by CR, kept FAULT_HOLD_SECONDS; and which
    faults have been reported (an Event posted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._growths: dict[tuple[str, str], list[Growth]] = {}
        self._missing: dict[tuple[str, str], list[MissingSeries]] = {}
        self._reported: dict[tuple[str, str], set[str]] = {}

    def add(self, cr: tuple[str, str], growth: Growth) -> None:
        with self._lock:
            self._growths.setdefault(cr, []).append(growth)

    def set_missing(self, missing: dict[tuple[str, str], list[MissingSeries]]
                    ) -> set[tuple[str, str]]:
        """The series every CR's engines lack now (one look); the CRs whose list changed."""
        with self._lock:
            now = {cr: list(series) for cr, series in missing.items() if series}
            changed = {cr for cr in set(now) | set(self._missing)
                       if now.get(cr) != self._missing.get(cr)}
            self._missing = now
            return changed

    def missing(self, cr: tuple[str, str]) -> list[MissingSeries]:
        with self._lock:
            return list(self._missing.get(cr, []))

    def recent(self, cr: tuple[str, str], now: datetime.datetime) -> list[Growth]:
        with self._lock:
            kept = [g for g in self._growths.get(cr, [])
                    if (now - g.at).total_seconds() <= FAULT_HOLD_SECONDS]
            self._growths[cr] = kept
            return list(kept)

    def faults(self, cr: tuple[str, str], now: datetime.datetime, policy: str) -> list[Fault]:
        """The CR's faults the engine watch saw: counters grown recently, series missing."""
        return [g.fault(policy) for g in self.recent(cr, now)] + [
            m.fault() for m in self.missing(cr)]

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
            self._missing.pop(cr, None)
            self._reported.pop(cr, None)



def condition(faults: list[Fault], now: datetime.datetime) -> tuple[dict[str, str], Optional[float]]:
    """The DataPathHealthy condition (type, status, reason, message) and the seconds until
    it turns True again (None when it is True, or held by a standing fault only)."""
    if not faults:
        return {"type": CONDITION, "status": "True", "reason": HEALTHY,
                "message": f"no data-path fault in the last {FAULT_HOLD_SECONDS:.0f} s"}, None
    last = max(faults, key=lambda f: f.at)
    more = f" ({len(faults) - 1} more in the last {FAULT_HOLD_SECONDS:.0f} s)" \
        if len(faults) > 1 else ""
    passing = [f for f in faults if not f.standing]
    until = None if not passing else max(
        FAULT_HOLD_SECONDS - (now - max(f.at for f in passing)).total_seconds(), 0.0) + 1
    return {"type": CONDITION, "status": "False", "reason": last.reason,
            "message": last.message + more}, until
