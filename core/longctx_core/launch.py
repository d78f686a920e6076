"""The launch document: what the operator rendered for one role, and what the pod runs.

The operator writes one document per role into the revision's engine ConfigMap (key
`<role>.json`, mounted at /etc/longctx). It holds vLLM's exact argv and environment, the
host checks' inputs, and only what a pod learns when it starts left as placeholders:

    ${POD_IP}          the pod's IP (Downward API status.podIP)
    ${STATEFULSET}     the pod's StatefulSet: its name without the ordinal
    ${START_RANK}      its first data-parallel rank: ordinal % podsPerGroup x ranksPerPod
    ${LEADER_ORDINAL}  the ordinal of pod 0 of its data-parallel group
    ${NIXL_PORT}       nixlBasePort - START_RANK (vLLM adds the global rank back)

Standard library only: the launcher reads this with no planner, API types or vLLM.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional

from longctx_core.contract import NIXL_SIDE_CHANNEL_PORT

# The document's format; a launcher runs exactly the formats it knows.
FORMAT_VERSION = 1
SUPPORTED_FORMATS = (FORMAT_VERSION,)
PLACEHOLDERS = ("POD_IP", "STATEFULSET", "START_RANK", "LEADER_ORDINAL", "NIXL_PORT")
_PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")


class LaunchError(ValueError):
    """A document this launcher cannot run, or a pod it cannot place."""


@dataclass(frozen=True)
class Requirement:
    """One host check: `need` units of `kind` on the host, explained by `what`, fixed by
    `fix` (both name the spec fields the operator derived them from)."""

    kind: str          # "gpus" | "shm" | "host-memory"
    need: int
    what: str
    fix: str


@dataclass(frozen=True)
class LaunchDocument:
    deployment: str
    namespace: str
    role: str
    argv: list[str]
    env: dict[str, str]
    vllm_version: str
    ranks_per_pod: int = 1
    pods_per_group: int = 1
    nixl_base_port: int = NIXL_SIDE_CHANNEL_PORT
    requirements: list[Requirement] = field(default_factory=list)
    preflight: bool = False
    # A PVC model whose name is not a path: <workdir>/<name> -> the mount, vLLM runs there,
    # so the verbatim --model string (hashed by NIXL) resolves to the weights.
    workdir: Optional[str] = None
    model_links: dict[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        """The document's text, made once: a reconcile reads it for the ConfigMap, each
        StatefulSet's config digest and the pair checks (a document is never changed)."""
        text = self.__dict__.get("_text")
        if text is None:
            doc = asdict(self)
            text = json.dumps({"format_version": doc.pop("format_version"), **doc}, indent=1)
            object.__setattr__(self, "_text", text)
        return text


def parse(text: str, source: str = "<launch document>") -> LaunchDocument:
    """The document, or LaunchError naming both format versions when this launcher cannot
    run it. Unknown keys of a known format are an error too: they would be silently lost."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise LaunchError(f"{source}: not JSON: {e}") from e
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if version not in SUPPORTED_FORMATS:
        raise LaunchError(
            f"{source}: launch document format {version!r}, but this engine image's launcher "
            f"runs format {', '.join(map(str, SUPPORTED_FORMATS))}: the operator and the "
            "engine image are from different longctx releases; set spec.engine.image to the "
            "engine image of the operator's release (or roll the operator back)")
    body = {k: v for k, v in raw.items() if k != "format_version"}
    try:
        body["requirements"] = [Requirement(**r) for r in body.get("requirements", [])]
        return LaunchDocument(**body, format_version=version)
    except TypeError as e:
        raise LaunchError(f"{source}: format {version} document does not match this "
                          f"launcher: {e}") from e


@dataclass(frozen=True)
class Launch:
    """A filled document: what one pod execs."""

    argv: list[str]
    env: dict[str, str]


def pod_values(doc: LaunchDocument, pod_name: str, pod_ip: str) -> dict[str, str]:
    match = re.fullmatch(r"(.+)-(\d+)", pod_name)
    if not match:
        raise LaunchError(f"pod name {pod_name!r} has no StatefulSet ordinal suffix (-N); "
                          "the engine must run in a pod of its role's StatefulSet")
    statefulset, ordinal = match.group(1), int(match.group(2))
    in_group = ordinal % doc.pods_per_group
    start = in_group * doc.ranks_per_pod
    return {"POD_IP": pod_ip, "STATEFULSET": statefulset, "START_RANK": str(start),
            "LEADER_ORDINAL": str(ordinal - in_group),
            "NIXL_PORT": str(doc.nixl_base_port - start)}


def _substitute(text: str, values: Mapping[str, str]) -> str:
    def one(m: re.Match) -> str:
        if m.group(1) not in values:
            raise LaunchError(f"unknown placeholder ${{{m.group(1)}}}; this launcher fills "
                              f"{', '.join(PLACEHOLDERS)}")
        return values[m.group(1)]
    return _PLACEHOLDER.sub(one, text)


def fill(doc: LaunchDocument, pod_name: str, pod_ip: str) -> Launch:
    values = pod_values(doc, pod_name, pod_ip)
    return Launch(argv=[_substitute(a, values) for a in doc.argv],
                  env={k: _substitute(v, values) for k, v in doc.env.items()})


def placeholders_used(doc: LaunchDocument) -> set[str]:
    texts = [*doc.argv, *doc.env.values()]
    return {m.group(1) for t in texts for m in _PLACEHOLDER.finditer(t)}


def as_dict(doc: LaunchDocument) -> dict[str, Any]:
    return json.loads(doc.to_json())
