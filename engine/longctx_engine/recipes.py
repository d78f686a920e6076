"""The prefill and decode `vllm serve` command lines and environment (vLLM 0.33.0).

Pure functions from a `LongContextDeploymentSpec`, a role and the pod's identity to
argv + env. Every flag and constraint used here is documented in
docs/vllm-engine.md (the project's vLLM reference); the contract tests in
tests/contract/ feed every variant to the real vLLM 0.33.0 parser and config classes.

This module must stay importable without vLLM or torch: the operator imports it.

Layout vocabulary (per role):
- rank: one vLLM engine (one data-parallel rank) of TP x PP x PCP GPUs;
- ranks per pod: gpusPerPod / (TP x PP x PCP);
- group: the pods that together form one engine with `dataParallel` ranks
  (dataParallel / ranks-per-pod pods; usually 1). Pods of a StatefulSet are grouped
  by ordinal: group k holds ordinals k*P .. k*P+P-1, and its pod with the lowest
  ordinal is the data-parallel master.

Data-parallel modes:
- none: dataParallel == 1 (the target prefill: one PCP engine on the whole pod);
- multi-port: >= 2 ranks per pod; vLLM's supervisor starts one API server per rank on
  port base+i and serves aggregated /health, /ready on base+ranks
  (`--data-parallel-multi-port-external-lb`, the form llm-d's wide-EP guides use);
- external: one rank per pod and dataParallel > 1 (`--data-parallel-rank`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Optional

from .api import LongContextDeploymentSpec
from .quantity import GiB, parse_bytes

ROLES = ("prefill", "decode")

PREFILL_HTTP_PORT = 8000
DECODE_HTTP_PORT = 8200
ROUTER_PORT = 8000          # llm-d routing sidecar on decode pods: 8000 + local rank
DP_RPC_PORT = 29550         # vLLM's default, written out so every pod of a group agrees
MODEL_MOUNT = "/models"     # where the operator mounts a PVC model source
MODEL_LINK_DIR = "/tmp/longctx-model"  # see EngineCommand.workdir

ENGINE_CONTAINER_COMMAND = ["longctx-engine", "run"]

# Memory-sizing constants (see shm_bytes / host_memory_bytes).
SHM_BASE_MARGIN = 4 * GiB        # NCCL SHM transport FIFOs, vLLM shm_broadcast rings, torch IPC
SHM_MARGIN_PER_GPU = 1 * GiB
RSS_PER_GPU_WORKER = 12 * GiB    # CUDA context, torch, NCCL/NIXL/UCX registrations, JIT caches
RSS_PER_ENGINE_RANK = 4 * GiB    # API server + engine core + scheduler of one DP rank
RSS_POD_BASE = 16 * GiB          # supervisor, tokenizer, page cache headroom while loading weights


class RecipeError(ValueError):
    """A spec the recipes refuse; the message names the spec field and the change to make."""


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class PodIdentity:
    """Who this engine pod is, from the Downward API env (POD_NAME, POD_NAMESPACE, POD_IP)."""

    cr_name: str
    namespace: str
    pod_name: str
    ordinal: int
    pod_ip: str

    @classmethod
    def from_env(cls, cr_name: str, namespace: str, role: str,
                 env: Optional[Mapping[str, str]] = None, *, strict: bool = True) -> "PodIdentity":
        """Reads POD_NAME / POD_NAMESPACE / POD_IP. The ordinal is the `-N` suffix of the
        StatefulSet pod name `<cr>-<role>-N`. With strict=False (dry runs outside a pod)
        missing values fall back to pod 0 and 127.0.0.1."""
        env = os.environ if env is None else env
        missing = [k for k in ("POD_NAME", "POD_IP") if not env.get(k)]
        if missing and strict:
            raise RecipeError(
                f"environment variable(s) {', '.join(missing)} are not set: the engine container "
                "needs POD_NAME (fieldRef metadata.name) and POD_IP (fieldRef status.podIP) from "
                "the Downward API; the NIXL side channel must advertise the pod IP")
        pod_name = env.get("POD_NAME") or f"{cr_name}-{role}-0"
        pod_ip = env.get("POD_IP") or "127.0.0.1"
        ns = env.get("POD_NAMESPACE") or namespace
        return cls(cr_name=cr_name, namespace=ns, pod_name=pod_name,
                   ordinal=parse_ordinal(pod_name), pod_ip=pod_ip)


def parse_ordinal(pod_name: str) -> int:
    match = re.search(r"-(\d+)$", pod_name)
    if not match:
        raise RecipeError(f"pod name {pod_name!r} has no StatefulSet ordinal suffix (-N); the "
                          "engine must run in a pod of the <cr>-<role> StatefulSet")
    return int(match.group(1))


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    role: str
    gpus_per_pod: int
    tp: int
    pp: int
    pcp: int
    dcp: int
    dp: int
    rank_gpus: int           # GPUs of one engine rank: TP x PP x PCP
    ranks_per_pod: int
    pods_per_group: int
    replicas: int

    @property
    def dp_mode(self) -> str:
        if self.dp == 1:
            return "none"
        return "multi-port" if self.ranks_per_pod >= 2 else "external"


def _role_spec(spec: LongContextDeploymentSpec, role: str):
    if role == "prefill":
        return spec.prefill
    if role == "decode":
        return spec.decode
    raise RecipeError(f"role must be one of {', '.join(ROLES)}, got {role!r}")


def layout(spec: LongContextDeploymentSpec, role: str) -> Layout:
    r = _role_spec(spec, role)
    cp = r.contextParallel
    rank_gpus = r.tensorParallel * r.pipelineParallel * cp.prefill
    path = f"spec.{role}"
    if rank_gpus > r.gpusPerPod or r.gpusPerPod % rank_gpus:
        raise RecipeError(
            f"{path}: one engine rank needs tensorParallel x pipelineParallel x "
            f"contextParallel.prefill = {r.tensorParallel} x {r.pipelineParallel} x {cp.prefill} = "
            f"{rank_gpus} GPUs, which must divide {path}.gpusPerPod ({r.gpusPerPod}); change "
            f"gpusPerPod or the parallel sizes")
    rpp = r.gpusPerPod // rank_gpus
    if r.dataParallel % rpp:
        raise RecipeError(
            f"{path}.dataParallel ({r.dataParallel}) must be a multiple of the ranks one pod holds "
            f"({rpp} = gpusPerPod {r.gpusPerPod} / {rank_gpus} GPUs per rank); set "
            f"{path}.dataParallel to {rpp} or a multiple of it")
    return Layout(role=role, gpus_per_pod=r.gpusPerPod, tp=r.tensorParallel,
                  pp=r.pipelineParallel, pcp=cp.prefill, dcp=cp.decode, dp=r.dataParallel,
                  rank_gpus=rank_gpus, ranks_per_pod=rpp, pods_per_group=r.dataParallel // rpp,
                  replicas=r.replicas)


def ranks_per_pod(spec: LongContextDeploymentSpec, role: str) -> int:
    """Engine ranks (vLLM data-parallel ranks) one pod of `role` runs."""
    return layout(spec, role).ranks_per_pod


@dataclass(frozen=True)
class EnginePorts:
    """Container ports of one engine pod."""

    http: list[int]                 # vLLM OpenAI servers: one per local rank
    supervisor: Optional[int]       # multi-port DP supervisor (/health, /ready, /readyz)
    nixl: list[int]                 # NIXL side channel per local rank
    router: list[int]               # llm-d routing sidecar, decode only (one per local rank)
    dp_rpc: Optional[int] = None    # DP engine handshake on the group's pod 0 (multi-pod groups)

    @property
    def health(self) -> int:
        """The port whose /health covers every rank of the pod."""
        return self.supervisor if self.supervisor is not None else self.http[0]


def _http_base(role: str) -> int:
    return PREFILL_HTTP_PORT if role == "prefill" else DECODE_HTTP_PORT


def engine_ports(spec: LongContextDeploymentSpec, role: str) -> EnginePorts:
    lay = layout(spec, role)
    base = _http_base(role)
    n = lay.ranks_per_pod
    multi = lay.dp_mode == "multi-port"
    http = [base + i for i in range(n)] if multi else [base]
    side = spec.kvTransfer.sideChannelPort
    router = ([ROUTER_PORT + i for i in range(n)]
              if role == "decode" and spec.router.enabled else [])
    return EnginePorts(http=http, supervisor=base + n if multi else None,
                       nixl=[side + i for i in range(n)], router=router,
                       dp_rpc=DP_RPC_PORT if lay.pods_per_group > 1 else None)


# --------------------------------------------------------------------------- memory


def offload_bytes_per_rank(spec: LongContextDeploymentSpec, role: str) -> int:
    r = _role_spec(spec, role)
    return parse_bytes(r.cpuOffloadPerRank, f"spec.{role}.cpuOffloadPerRank")


def hisparse_enabled(spec: LongContextDeploymentSpec, role: str) -> bool:
    return role == "decode" and spec.decode.hiSparse.enabled


def hisparse_bytes_per_rank(spec: LongContextDeploymentSpec, role: str) -> int:
    if not hisparse_enabled(spec, role):
        return 0
    return parse_bytes(spec.decode.hiSparse.hostPoolPerRank, "spec.decode.hiSparse.hostPoolPerRank")


def shm_bytes(spec: LongContextDeploymentSpec, role: str) -> int:
    """Size of the pod's /dev/shm (emptyDir medium Memory).

    Each engine rank's OffloadingConnector maps `/dev/shm/vllm_offload_<engine_id>.mmap` of
    up to cpu_bytes_to_use bytes, and vLLM refuses to start when /dev/shm has less free space.
    On top: a margin of 4 GiB + 1 GiB per GPU for what else lives in /dev/shm: NCCL's SHM
    transport buffers between local ranks, vLLM's shm_broadcast message-queue rings (engine
    core <-> workers, one set per rank), and torch multiprocessing tensors. llm-d's wide-EP
    guide measured ~32 MB per local DP rank for the latter two, so the margin is generous on
    purpose: running out aborts a load that took tens of minutes.
    """
    lay = layout(spec, role)
    return (lay.ranks_per_pod * offload_bytes_per_rank(spec, role) + SHM_BASE_MARGIN
            + SHM_MARGIN_PER_GPU * lay.gpus_per_pod)


def host_memory_bytes(spec: LongContextDeploymentSpec, role: str) -> int:
    """The pod's memory request (and limit).

    - CPU offload: the /dev/shm pages are tmpfs and are charged to the pod's memory cgroup;
    - HiSparse: every decode rank pins its own host_pool_gib with torch.empty + pin_memory
      (at TP1 there is no shared pool, vllm-engine.md §5);
    - process RSS: 12 GiB per GPU worker (CUDA context, torch, NCCL/NIXL/UCX registrations,
      Triton/DeepGEMM JIT), 4 GiB per engine rank (API server, engine core, scheduler,
      detokenizer), 16 GiB per pod (supervisor, tokenizer, page-cache headroom while
      safetensors are read).
    """
    lay = layout(spec, role)
    n = lay.ranks_per_pod
    return (n * offload_bytes_per_rank(spec, role) + n * hisparse_bytes_per_rank(spec, role)
            + RSS_PER_GPU_WORKER * lay.gpus_per_pod + RSS_PER_ENGINE_RANK * n + RSS_POD_BASE)


# --------------------------------------------------------------------------- validation

# Flags the recipes set, with the spec field that controls them. Keys are canonical long
# names without the leading "--". Short aliases are mapped to these by _ALIASES.
_MANAGED: dict[str, str] = {
    "model": "spec.model.name",
    "model-tag": "spec.model.name",
    "served-model-name": "spec.model.servedName",
    "port": "the recipe (prefill 8000, decode 8200 + local rank; not configurable)",
    "tensor-parallel-size": "spec.{role}.tensorParallel",
    "pipeline-parallel-size": "spec.{role}.pipelineParallel",
    "prefill-context-parallel-size": "spec.{role}.contextParallel.prefill",
    "decode-context-parallel-size": "spec.{role}.contextParallel.decode",
    "dcp-comm-backend": "spec.{role}.contextParallel.commBackend",
    "data-parallel-size": "spec.{role}.dataParallel",
    "data-parallel-size-local": "spec.{role}.gpusPerPod (ranks per pod)",
    "data-parallel-rank": "the pod's StatefulSet ordinal",
    "data-parallel-start-rank": "the pod's StatefulSet ordinal",
    "data-parallel-address": "the group's pod 0 (headless Service DNS name)",
    "data-parallel-rpc-port": "the recipe",
    "data-parallel-backend": "the recipe (mp)",
    "data-parallel-multi-port-external-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-external-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-hybrid-lb": "the recipe (one HTTP port per rank)",
    "data-parallel-supervisor-port": "the recipe (HTTP base port + ranks per pod)",
    "api-server-count": "the recipe (one API server per rank)",
    "headless": "the recipe (every pod serves HTTP)",
    "nnodes": "spec.{role}.dataParallel and gpusPerPod",
    "node-rank": "the pod's StatefulSet ordinal",
    "master-addr": "the group's pod 0",
    "enable-expert-parallel": "spec.{role}.expertParallel",
    "attention-config": "the recipe (prefill: sparse_mla_force_mqa; decode: "
                        "spec.decode.hiSparse.deviceBufferSize)",
    "kv-cache-dtype": "spec.engine.kvCacheDtype",
    "max-model-len": "spec.maxContextTokens",
    "speculative-config": "spec.engine.speculative",
    "spec-method": "spec.engine.speculative.method",
    "spec-model": "spec.engine.speculative",
    "spec-tokens": "spec.engine.speculative.draftTokens",
    "kv-transfer-config": "spec.kvTransfer, spec.{role}.cpuOffloadPerRank and "
                          "spec.decode.hiSparse",
}

_ALIASES = {
    "tp": "tensor-parallel-size", "pp": "pipeline-parallel-size",
    "pcp": "prefill-context-parallel-size", "dcp": "decode-context-parallel-size",
    "dp": "data-parallel-size", "dpn": "data-parallel-rank", "dpr": "data-parallel-start-rank",
    "dpl": "data-parallel-size-local", "dpa": "data-parallel-address",
    "dpp": "data-parallel-rpc-port", "dpb": "data-parallel-backend",
    "dph": "data-parallel-hybrid-lb", "dpe": "data-parallel-external-lb",
    "dpm": "data-parallel-multi-port-external-lb", "ep": "enable-expert-parallel",
    "ac": "attention-config", "sc": "speculative-config", "asc": "api-server-count",
    "n": "nnodes", "r": "node-rank", "cc": "compilation-config", "q": "quantization",
    "disable-expert-parallel": "enable-expert-parallel",
}

_DISABLE_HMA = {"disable-hybrid-kv-cache-manager", "no-enable-hybrid-kv-cache-manager"}


@dataclass(frozen=True)
class _Arg:
    index: int
    raw: str
    name: str               # canonical: long name without "--", '_' -> '-', alias resolved
    spelled: str            # as written, without value, '_' -> '-' (keeps no-/disable-)
    value: Optional[str]    # "=value" or the following token when it is not a flag


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not re.match(r"^-\d", token) and token != "-"


def parse_flags(args: list[str]) -> list[_Arg]:
    """The flags in an argv fragment, with `--flag=value`, `_`/`-`, dotted keys
    (`--attention-config.x`) and short aliases normalised."""
    out = []
    for i, token in enumerate(args):
        if not _is_flag(token):
            continue
        head, eq, value = token.partition("=")
        body = head.lstrip("-")
        base = body.split(".", 1)[0].replace("_", "-")
        spelled = base
        name = _ALIASES.get(base, base)
        if name.startswith("no-"):
            name = _ALIASES.get(name[3:], name[3:])
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            value = nxt if nxt is not None and not _is_flag(nxt) else None
        out.append(_Arg(i, token, name, spelled, value if (eq or value is not None) else None))
    return out


def _cudagraph_full(arg: _Arg) -> bool:
    if arg.name != "compilation-config":
        return False
    raw_key = arg.raw.partition("=")[0]
    if "." in raw_key:      # -cc.cudagraph_mode=FULL
        return (raw_key.split(".", 1)[1].replace("-", "_") == "cudagraph_mode"
                and (arg.value or "").strip().strip("'\"") == "FULL")
    try:
        cfg = json.loads(arg.value or "")
    except ValueError:
        return False
    return isinstance(cfg, dict) and cfg.get("cudagraph_mode") == "FULL"


def extra_args_problems(spec: LongContextDeploymentSpec, role: str) -> list[str]:
    """What is wrong with spec.engine.extraArgs.<role> (empty when nothing)."""
    args = list(getattr(spec.engine.extraArgs, role))
    lay = layout(spec, role)
    cp = lay.pcp > 1 or lay.dcp > 1
    mtp = spec.engine.speculative.method == "mtp"
    hisparse = hisparse_enabled(spec, role)
    problems = []
    for a in parse_flags(args):
        where = f"spec.engine.extraArgs.{role}[{a.index}] ({a.raw!r})"
        if a.name in ("kv-offloading-size", "kv-offloading-backend"):
            problems.append(
                f"{where}: --{a.name} replaces the NIXL KV connector without an error, so "
                f"decode would never receive KV; remove it and size the CPU offload with "
                f"spec.{role}.cpuOffloadPerRank (the recipe adds an OffloadingConnector to the "
                "MultiConnector)")
        elif a.name in _MANAGED:
            hint = _MANAGED[a.name].format(role=role)
            problems.append(f"{where}: --{a.name} is set by the recipe from {hint}; remove it "
                            "from extraArgs" + ("" if hint.startswith("the ") else
                                                f" and set {hint.split(' ')[0]} instead"))
        elif a.spelled in _DISABLE_HMA:
            problems.append(
                f"{where}: the hybrid KV cache manager must stay on for both roles (it is part "
                "of the NIXL compatibility hash, and HiSparse requires it); remove the flag")
        elif a.name in ("enable-dbo", "ubatch-size") and (mtp or cp or hisparse):
            problems.append(
                f"{where}: dual batch overlap is rejected by vLLM with MTP, context parallelism "
                "or HiSparse (Model Runner V2); remove it")
        elif a.spelled == "no-scheduler-reserve-full-isl" and hisparse:
            problems.append(f"{where}: HiSparse requires --scheduler-reserve-full-isl; remove "
                            "the flag or set spec.decode.hiSparse.enabled to false")
        elif a.name == "enable-return-routed-experts" and cp:
            problems.append(f"{where}: routed-expert return is incompatible with context "
                            "parallelism (DCP/PCP > 1); remove it")
        elif _cudagraph_full(a) and (hisparse or lay.pcp > 1):
            problems.append(
                f"{where}: cudagraph_mode=FULL is rejected with "
                f"{'HiSparse' if hisparse else 'prefill context parallelism'}; use "
                "FULL_AND_PIECEWISE (the default) or FULL_DECODE_ONLY")
    return problems


def role_problems(spec: LongContextDeploymentSpec, role: str) -> list[str]:
    """Everything the recipes refuse for `role`, as messages naming the field to change."""
    try:
        lay = layout(spec, role)
    except RecipeError as e:
        return [str(e)]
    p = f"spec.{role}"
    r = _role_spec(spec, role)
    problems = []
    cpb = r.contextParallel.commBackend
    if lay.pcp > 1 and lay.dcp > 1:
        if cpb != "ag_rs":
            problems.append(
                f"{p}.contextParallel.commBackend is {cpb!r}: vLLM's Model Runner V2 rejects "
                "a2a with both prefill and decode context parallelism above 1 (the GLM model "
                "default is a2a); set it to ag_rs")
        if lay.tp != 1 or lay.dcp != lay.pcp:
            problems.append(
                f"{p}: NIXL with PCP and DCP needs tensorParallel 1 and contextParallel.decode "
                f"equal to contextParallel.prefill (got TP {lay.tp}, PCP {lay.pcp}, "
                f"DCP {lay.dcp})")
    if lay.pcp > 1 and lay.dcp not in (1, lay.pcp, lay.tp * lay.pcp):
        problems.append(f"{p}.contextParallel.decode must be 1, {lay.pcp} or "
                        f"{lay.tp * lay.pcp} with contextParallel.prefill {lay.pcp}")
    if lay.pcp == 1 and lay.dcp > 1 and lay.tp % lay.dcp:
        problems.append(f"{p}.contextParallel.decode ({lay.dcp}) must divide tensorParallel "
                        f"({lay.tp}) when contextParallel.prefill is 1")
    if lay.dcp > 1 and lay.dcp != max(lay.tp, lay.pcp):
        problems.append(f"{p}.contextParallel.decode must be 1 or {max(lay.tp, lay.pcp)} (the "
                        "NIXL transfer parallel size, max(tensorParallel, "
                        "contextParallel.prefill))")
    if role == "decode" and lay.pcp > 1:
        problems.append("spec.decode.contextParallel.prefill must be 1: NIXL supports prefill "
                        "context parallelism only on the producer (prefill) side")
    if lay.dcp > 1 and spec.engine.kvCacheDtype == "auto":
        problems.append(f"spec.engine.kvCacheDtype is auto, which is a bf16 cache on H200; "
                        f"{p}.contextParallel.decode > 1 needs fp8_ds_mla: set kvCacheDtype to fp8")
    if hisparse_enabled(spec, role):
        if lay.dcp > 1:
            problems.append("HiSparse does not support decode context parallelism: set "
                            "spec.decode.contextParallel.decode to 1 or "
                            "spec.decode.hiSparse.enabled to false")
        if lay.pp > 1:
            problems.append("HiSparse does not support pipeline parallelism: set "
                            "spec.decode.pipelineParallel to 1 or spec.decode.hiSparse.enabled "
                            "to false")
        if hisparse_bytes_per_rank(spec, role) <= 0:
            problems.append("spec.decode.hiSparse.hostPoolPerRank must be positive")
    if lay.replicas and lay.pods_per_group > 1 and lay.replicas % lay.pods_per_group:
        problems.append(
            f"{p}.replicas ({lay.replicas}) must be a multiple of the pods of one data-parallel "
            f"group ({lay.pods_per_group} = dataParallel {lay.dp} / {lay.ranks_per_pod} ranks "
            "per pod)")
    try:
        offload_bytes_per_rank(spec, role)
        hisparse_bytes_per_rank(spec, role)
    except ValueError as e:
        problems.append(str(e))
    s = spec.engine.speculative
    if s.method == "mtp" and s.draftTokens < 1:
        problems.append("spec.engine.speculative.draftTokens must be at least 1 with method mtp")
    if s.method == "mtp":
        problems += _mtp_problems(spec, lay)
    problems += extra_args_problems(spec, role)
    return problems


def _mtp_problems(spec: LongContextDeploymentSpec, lay: Layout) -> list[str]:
    """MTP needs draft layers; under PCP, Model Runner V2 runs single-module MTP only
    (min(num_nextn_predict_layers, num_speculative_tokens) must be 1)."""
    try:
        from .models import resolve_architecture   # pure Python; absent in old trees
        arch = resolve_architecture(spec.model)
    except (ImportError, ValueError):
        return []   # the planner reports an unknown architecture
    if arch.mtpLayers == 0:
        return ["spec.engine.speculative.method is mtp but the model has no MTP layers "
                "(architecture mtpLayers 0); set the method to none"]
    if lay.pcp > 1 and min(arch.mtpLayers, spec.engine.speculative.draftTokens) > 1:
        return [f"spec.{lay.role}.contextParallel.prefill > 1 runs only single-module MTP, but "
                f"the model has {arch.mtpLayers} MTP layers and draftTokens is "
                f"{spec.engine.speculative.draftTokens}; set spec.engine.speculative.draftTokens "
                "to 1"]
    return []


def validate(spec: LongContextDeploymentSpec, role: Optional[str] = None) -> None:
    """Raises RecipeError listing every problem of `role` (or both roles)."""
    problems = []
    for r in ([role] if role else ROLES):
        problems += role_problems(spec, r)
    if problems:
        raise RecipeError("; ".join(problems))


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class EngineCommand:
    """What the entrypoint execs. `workdir`/`symlinks`: for a PVC model source whose
    spec.model.name is not a path, the entrypoint creates `<workdir>/<name>` -> /models and
    runs vLLM in `workdir`, so the verbatim --model string (hashed by NIXL) resolves to the
    mounted weights."""

    argv: list[str]
    env: dict[str, str]
    workdir: Optional[str] = None
    symlinks: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        return shlex.join(self.argv)


def kv_cache_dtype(spec: LongContextDeploymentSpec) -> str:
    """The --kv-cache-dtype value: fp8 is written as vLLM canonicalises it for sparse MLA."""
    return "fp8_ds_mla" if spec.engine.kvCacheDtype in ("fp8", "fp8_ds_mla") else "auto"


def _gib(n: int) -> int | float:
    v = n / GiB
    return int(v) if v == int(v) else v


def kv_transfer_config(spec: LongContextDeploymentSpec, role: str) -> dict:
    """The --kv-transfer-config object: NIXL first (a remote-prefill pull beats a partial CPU
    hit), then HiSparse (decode), then CPU offload. No engine_id anywhere (MultiConnector
    passes its own to each child)."""
    nixl_role = "kv_producer" if role == "prefill" else "kv_consumer"
    nixl = {"kv_connector": "NixlConnector", "kv_role": nixl_role,
            "kv_connector_extra_config": {"backends": [spec.kvTransfer.backend]}}
    children = [nixl]
    if hisparse_enabled(spec, role):
        children.append({"kv_connector": "HiSparseConnector", "kv_role": "kv_consumer",
                         "kv_connector_extra_config": {
                             "host_pool_gib": _gib(hisparse_bytes_per_rank(spec, role))}})
    offload = offload_bytes_per_rank(spec, role)
    if offload:
        children.append({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"cpu_bytes_to_use": offload}})
    if len(children) == 1:
        return nixl
    return {"kv_connector": "MultiConnector", "kv_role": nixl_role,
            "kv_connector_extra_config": {"connectors": children}}


def speculative_config(spec: LongContextDeploymentSpec) -> Optional[dict]:
    s = spec.engine.speculative
    if s.method != "mtp":
        return None
    return {"method": "mtp", "num_speculative_tokens": s.draftTokens}


def attention_config(spec: LongContextDeploymentSpec, role: str) -> Optional[dict]:
    if role == "prefill":
        return {"sparse_mla_force_mqa": True}
    if hisparse_enabled(spec, role) and spec.decode.hiSparse.deviceBufferSize:
        return {"hisparse_config": {"device_buffer_size": spec.decode.hiSparse.deviceBufferSize}}
    return None


def group_leader_address(spec: LongContextDeploymentSpec, role: str, pod: PodIdentity) -> str:
    """DNS name of pod 0 of this pod's data-parallel group (headless Service `<cr>-<role>`)."""
    lay = layout(spec, role)
    leader = pod.ordinal - pod.ordinal % lay.pods_per_group
    svc = f"{pod.cr_name}-{role}"
    return f"{svc}-{leader}.{svc}.{pod.namespace}.svc"


def start_rank(spec: LongContextDeploymentSpec, role: str, pod: PodIdentity) -> int:
    """Global data-parallel rank of this pod's first engine rank."""
    lay = layout(spec, role)
    return (pod.ordinal % lay.pods_per_group) * lay.ranks_per_pod


def _dumps(obj: dict, compact: bool = False) -> str:
    return json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj)


def build_command(spec: LongContextDeploymentSpec, role: str, pod: PodIdentity) -> EngineCommand:
    """argv + env of the `vllm serve` process of one pod of `role`."""
    validate(spec, role)
    lay = layout(spec, role)
    r = _role_spec(spec, role)
    ports = engine_ports(spec, role)
    model = spec.model.name
    argv = ["vllm", "serve", model]
    if spec.model.servedName:
        argv += ["--served-model-name", spec.model.servedName]
    argv += ["--port", str(ports.http[0]), "--tensor-parallel-size", str(lay.tp)]
    if lay.pp > 1:
        argv += ["--pipeline-parallel-size", str(lay.pp)]
    if lay.pcp > 1:
        argv += ["--prefill-context-parallel-size", str(lay.pcp)]
    if lay.dcp > 1:
        argv += ["--decode-context-parallel-size", str(lay.dcp),
                 "--dcp-comm-backend", r.contextParallel.commBackend]
    first_rank = start_rank(spec, role, pod)
    if lay.dp_mode == "multi-port":
        argv += ["--data-parallel-size", str(lay.dp),
                 "--data-parallel-size-local", str(lay.ranks_per_pod),
                 "--data-parallel-multi-port-external-lb",
                 "--data-parallel-supervisor-port", str(ports.supervisor)]
        if lay.pods_per_group > 1:
            argv += ["--data-parallel-start-rank", str(first_rank)]
    elif lay.dp_mode == "external":
        argv += ["--data-parallel-size", str(lay.dp), "--data-parallel-rank", str(first_rank),
                 "--data-parallel-size-local", "1"]
    if lay.pods_per_group > 1:
        argv += ["--data-parallel-address", group_leader_address(spec, role, pod),
                 "--data-parallel-rpc-port", str(DP_RPC_PORT)]
    if r.expertParallel:
        argv.append("--enable-expert-parallel")
    att = attention_config(spec, role)
    if att:
        argv += ["--attention-config", _dumps(att)]
    argv += ["--kv-cache-dtype", kv_cache_dtype(spec), "--max-model-len",
             str(spec.maxContextTokens)]
    sc = speculative_config(spec)
    if sc:
        argv += ["--speculative-config", _dumps(sc)]
    argv += ["--kv-transfer-config", _dumps(kv_transfer_config(spec, role), compact=True)]
    argv += list(getattr(spec.engine.extraArgs, role))

    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": pod.pod_ip,
        # vLLM listens on base + global DP rank; shifting the base by the start rank keeps
        # every pod's ports at sideChannelPort + local rank.
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.kvTransfer.sideChannelPort - first_rank),
        "VLLM_ENGINE_READY_TIMEOUT_S": str(spec.engine.engineReadyTimeoutSeconds),
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "LONGCTX_VLLM_VERSION": spec.engine.vllmVersion,
    }
    if role == "prefill":
        # llm-d's sidecar keeps idle connections 90 s; vLLM's default keep-alive is 5 s.
        env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = "120"
    workdir, links = None, {}
    if spec.model.source.pvc is not None:
        env["HF_HUB_OFFLINE"] = "1"
        if not model.startswith("/"):
            workdir, links = MODEL_LINK_DIR, {model: MODEL_MOUNT}
    return EngineCommand(argv=argv, env=env, workdir=workdir, symlinks=links)
