"""What one engine pod runs, for tests: its role's launch document filled with the pod's name
and IP, as the pod's launcher fills it (engine/longctx_engine/entrypoint.py)."""

from __future__ import annotations

from dataclasses import dataclass

from longctx_core.launch import fill
from longctx_core.plan.roles import RolePlan
from longctx_core.vllm_config.recipes import EngineCommand, launch_document


@dataclass(frozen=True)
class Pod:
    cr_name: str
    namespace: str
    pod_name: str
    pod_ip: str


def pod(role: str, ordinal: int = 0, cr: str = "glm", ns: str = "llm") -> Pod:
    return Pod(cr_name=cr, namespace=ns, pod_name=f"{cr}-{role}-{ordinal}",
               pod_ip=f"10.1.{0 if role == 'prefill' else 1}.{ordinal + 7}")


def pod_command(plan: RolePlan, pod: Pod) -> EngineCommand:
    doc = launch_document(plan, pod.cr_name, pod.namespace)
    filled = fill(doc, pod.pod_name, pod.pod_ip)
    return EngineCommand(argv=filled.argv, env=filled.env, workdir=doc.workdir,
                         symlinks=doc.model_links)
