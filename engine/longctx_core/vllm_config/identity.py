"""Who an engine pod is, from the Downward API environment (contract.DOWNWARD_ENV)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from longctx_core import contract
from longctx_core.sizing.rules import RecipeError


@dataclass(frozen=True)
class PodIdentity:
    cr_name: str
    namespace: str
    pod_name: str
    ordinal: int
    pod_ip: str

    @classmethod
    def from_env(cls, cr_name: str, namespace: str, role: str,
                 env: Optional[Mapping[str, str]] = None, *, strict: bool = True) -> "PodIdentity":
        """The ordinal is the `-N` suffix of the StatefulSet pod name. With strict=False (dry
        runs outside a pod) missing values fall back to pod 0 and 127.0.0.1."""
        env = os.environ if env is None else env
        missing = [k for k in (contract.ENV_POD_NAME, contract.ENV_POD_IP) if not env.get(k)]
        if missing and strict:
            raise RecipeError(
                f"environment variable(s) {', '.join(missing)} are not set: the engine container "
                f"needs {contract.ENV_POD_NAME} (fieldRef metadata.name) and "
                f"{contract.ENV_POD_IP} (fieldRef status.podIP) from the Downward API; the "
                "NIXL side channel must advertise the pod IP")
        pod_name = env.get(contract.ENV_POD_NAME) or contract.pod(f"{cr_name}-{role}", 0)
        pod_ip = env.get(contract.ENV_POD_IP) or "127.0.0.1"
        ns = env.get(contract.ENV_POD_NAMESPACE) or namespace
        return cls(cr_name=cr_name, namespace=ns, pod_name=pod_name,
                   ordinal=parse_ordinal(pod_name), pod_ip=pod_ip)

    @classmethod
    def first(cls, cr_name: str, namespace: str, statefulset: str) -> "PodIdentity":
        """Pod 0 of a StatefulSet, for commands rendered outside a pod."""
        return cls(cr_name=cr_name, namespace=namespace, pod_name=contract.pod(statefulset, 0),
                   ordinal=0, pod_ip="0.0.0.0")

    @property
    def statefulset(self) -> str:
        """The StatefulSet of this pod: its name without the ordinal suffix."""
        return self.pod_name.rsplit("-", 1)[0]


def parse_ordinal(pod_name: str) -> int:
    match = re.search(r"-(\d+)$", pod_name)
    if not match:
        raise RecipeError(f"pod name {pod_name!r} has no StatefulSet ordinal suffix (-N); the "
                          "engine must run in a pod of the <cr>-<role> StatefulSet")
    return int(match.group(1))
