"""What a change will do to the running engines, said before anything starts: which roles
roll and how, the GPUs at the peak, and the warm prefixes prefill loses.

The decision is the operator's own (replacement.plan_for_revision against the revision
that runs): `longctx plan -f new.yaml --from running.yaml` renders the running spec's
StatefulSets and asks the same question offline; the operator writes the answer into
`status.rollout.cost` and the `RolloutStarted` event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.builders.engine import statefulset
from longctx_operator.controller.pods import requested_gpus
from longctx_operator.controller.replacement import Replacement, changes_template
from longctx_operator.controller.rollout import Revision
from longctx_operator.controller.routers import Router

# How a role's pods go through a change.
KEEPS = "keeps its pods"
IN_PLACE = "rolls in place, one pod at a time"
BESIDE = "new pods beside the serving ones"
RESTART = "restarts in place, serving nothing until Ready"


def pod_gpus(sts: Optional[dict[str, Any]]) -> int:
    """GPUs one pod of a StatefulSet requests."""
    if not sts:
        return 0
    return requested_gpus(sts["spec"]["template"]["spec"])


def replicas(sts: Optional[dict[str, Any]]) -> int:
    return ((sts or {}).get("spec") or {}).get("replicas", 0)


@dataclass(frozen=True)
class RoleRoll:
    role: str
    how: str
    pods: tuple[int, int]           # before, after
    gpus_per_pod: tuple[int, int]

    @property
    def gpus(self) -> tuple[int, int]:
        return self.pods[0] * self.gpus_per_pod[0], self.pods[1] * self.gpus_per_pod[1]

    @property
    def peak_gpus(self) -> int:
        before, after = self.gpus
        return before + after if self.how == BESIDE else max(before, after)


@dataclass(frozen=True)
class RolloutCost:
    """The cost of one change (see the module docstring)."""

    roles: tuple[RoleRoll, ...]
    new_pairing_key: bool
    pairing_changes: tuple[str, ...]   # the pairing key's fields that change, where known
    prefix_tokens: int                 # prefill's CPU tier over its running pods, in tokens
    gpu_product: str

    @property
    def peak_gpus(self) -> int:
        return sum(r.peak_gpus for r in self.roles)

    @property
    def running_gpus(self) -> int:
        return sum(r.gpus[0] for r in self.roles)

    @property
    def lost_prefix_tokens(self) -> int:
        """What a role rolled loses of prefill's warm prefixes: all of them, since a new
        engine starts with an empty CPU tier."""
        prefill = next(r for r in self.roles if r.role == "prefill")
        return 0 if prefill.how == KEEPS else self.prefix_tokens

    @property
    def rolls(self) -> list[str]:
        return [r.role for r in self.roles if r.how != KEEPS]

    def to_json(self) -> dict[str, Any]:
        return {"roles": {r.role: r.how for r in self.roles},
                "newPairingKey": self.new_pairing_key,
                "runningGPUs": self.running_gpus, "peakGPUs": self.peak_gpus,
                "lostPrefixTokens": self.lost_prefix_tokens}

    def describe(self) -> str:
        """One sentence, for the RolloutStarted event."""
        roles = "; ".join(f"{r.role}: {r.how}" for r in self.roles)
        return f"cost: {roles}; {self._gpus()} at the peak; {self._lost()}"

    def _lost(self) -> str:
        if "prefill" not in self.rolls:
            return "prefill keeps its warm prefixes"
        if not self.lost_prefix_tokens:
            return "prefill's new pods start with an empty prefix cache (it has no CPU tier)"
        return (f"prefill's CPU tier loses its warm prefixes ({self.lost_prefix_tokens:,} "
                "tokens): each session's next turn prefills its whole prompt again")

    def _gpus(self) -> str:
        if not self.peak_gpus:
            return "no GPUs (CPU engines)"
        return f"{self.peak_gpus} {self.gpu_product} GPUs ({self.running_gpus} running)"

    def render(self) -> str:
        """What `longctx plan --from` prints."""
        fields = f" ({', '.join(self.pairing_changes)})" if self.pairing_changes else ""
        key = (f"the pairing key changes{fields}: both roles roll together"
               if self.new_pairing_key else
               "the pairing key stays: each role rolls only if its pods change")
        lines = [f"Rollout: {key}",
                 *(f"  {r.role:<8} {r.how} ({r.pods[0]} -> {r.pods[1]} pods of "
                   f"{r.gpus_per_pod[1]} GPUs)" for r in self.roles),
                 f"  at the peak: {self._gpus()}"]
        if self.lost_prefix_tokens:
            lines += [f"  lost: prefill's CPU tier of warm prefixes, "
                      f"{self.lost_prefix_tokens:,} tokens;",
                      "        warm again as sessions send their next turns, each "
                      "prefilling its whole prompt once"]
        else:
            lines.append(f"  lost: {self._lost()}")
        return "\n".join(lines)


def rollout_cost(cr: dict[str, Any], plan: ServingPlan, router: Router,
                 live: Optional[Revision], replaced: Optional[Replacement],
                 prefix_tokens_per_pod: int, pairing_changes: tuple[str, ...] = ()
                 ) -> RolloutCost:
    """The cost of rolling `plan` (its role revisions decided by plan_for_revision) onto
    `live`, the revision that serves, as it runs (each role's serving StatefulSet);
    `pairing_changes`: the pairing key's fields that change, where the running spec is
    known."""
    new_key = live is None or live.name != plan.pairing_key
    strategy = plan.spec.rollout.strategy
    rolls = []
    for role in plan.roles:
        desired = statefulset(cr, role, router)
        running = (live.statefulsets.get(role.role) if live is not None else None)
        if new_key or running is None:
            how = BESIDE if strategy == "Surge" else RESTART
        elif replaced is not None and role.role in replaced.roles:
            how = BESIDE
        elif not changes_template(desired, running):
            how = KEEPS
        else:
            how = IN_PLACE if min(replicas(running), role.replicas) >= 2 else RESTART
        rolls.append(RoleRoll(role.role, how, (replicas(running), role.replicas),
                              (pod_gpus(running), pod_gpus(desired))))
    prefill = next(r for r in rolls if r.role == "prefill")
    return RolloutCost(tuple(rolls), new_key, pairing_changes,
                       prefix_tokens_per_pod * prefill.pods[0],
                       plan.spec.placement.gpuProduct)


def prefix_tokens_per_pod(plan_json: Optional[dict[str, Any]]) -> int:
    """Prefill's CPU tier of one pod, in tokens, from a capacity plan's JSON
    (status.plan)."""
    return int(((plan_json or {}).get("prefill") or {}).get("cpuOffloadTokens") or 0)

