"""Pure builders: the per-role plans of a spec -> the objects of its revision (each role's
StatefulSet and PodDisruptionBudget, the engine ConfigMap) and the role's headless Service,
which every revision shares."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Mapping

from longctx_core import contract
from longctx_core.sizing import cpu_platform
from longctx_core.quantity import format_bytes
from longctx_core.plan.roles import RolePlan, ServingPlan

from longctx_operator.controller.builders.digest import content_digest
from longctx_operator.controller.routers import Router
from longctx_operator.controller.rendering import document

# Loading weights after a crash is slow; vLLM drains in-flight requests on SIGTERM.
TERMINATION_GRACE_SECONDS = 120
PROBE_PERIOD_SECONDS = 10
# CPU cores per pod: tokenizers, API servers, the offload and HiSparse copy threads.
CPU_PER_GPU = 12
GPU_TOLERATION = {"key": contract.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def pod_role_revision(role: RolePlan) -> str | None:
    """The role revision a role's pod template and selectors name: only a replacement's.
    Pods of the key's own role revision carry none, so that their StatefulSets keep the
    selector they were created with (a selector cannot change) across operator upgrades;
    a replacement's StatefulSet never adopts them, since a StatefulSet claims only pods
    named after it."""
    return role.revision if role.revision != role.pairing_key else None


def _meta(cr: dict[str, Any], name: str, component: str, pairing: str | None = None,
          role_revision: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": cr["metadata"]["namespace"],
            "labels": contract.labels(cr["metadata"]["name"], component, pairing, role_revision),
            "ownerReferences": [contract.owner_reference(cr)]}


def launch_documents(cr: dict[str, Any], plan: ServingPlan) -> dict[str, str]:
    """Each role's launch document, by its ConfigMap key: what the role's pods run."""
    return {contract.launch_key(role.role): document(cr, role).to_json()
            for role in plan.roles}


def engine_configmaps(cr: dict[str, Any], plan: ServingPlan) -> list[dict[str, Any]]:
    """One ConfigMap per role revision of the plan, each with every role's launch document
    (a role's pods mount their own role revision's)."""
    meta = cr["metadata"]
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": _meta(cr, contract.engine_configmap(meta["name"], revision),
                               contract.ENGINE_CONFIG_COMPONENT, plan.pairing_key, revision),
             "data": launch_documents(cr, plan)}
            for revision in dict.fromkeys(plan.role_revisions.values())]


def headless_service(cr: dict[str, Any], role: RolePlan) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(cr, contract.headless_service(name, role.role), role.role),
        "spec": {
            "clusterIP": "None",
            # Data-parallel ranks find pod 0 of their group before any pod is Ready.
            "publishNotReadyAddresses": True,
            "selector": contract.selector_labels(name, role.role),
            "ports": [{"name": p["name"], "port": p["containerPort"], "protocol": "TCP"}
                      for p in container_ports(role)],
        },
    }


def max_unavailable(role: RolePlan) -> int:
    """Pods of the role an eviction (a node drain) may take at once. A role's only pod is
    never evicted under Surge: the operator brings up its replacement on another node first
    (controller/replacement.py) and removes it once drained; Recreate accepts the gap."""
    return 0 if role.replicas < 2 and role.spec.rollout.strategy == "Surge" else 1


def pod_disruption_budget(cr: dict[str, Any], role: RolePlan) -> dict[str, Any]:
    """One per role revision. The key's own one leaves out a replacement's pods, which its
    labels would select too: the eviction API refuses a pod that two budgets select."""
    name = cr["metadata"]["name"]
    selector: dict[str, Any] = {"matchLabels": contract.selector_labels(
        name, role.role, role.pairing_key, pod_role_revision(role))}
    if pod_role_revision(role) is None:
        selector["matchExpressions"] = [{"key": contract.ROLE_REVISION_LABEL,
                                         "operator": "DoesNotExist"}]
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": _meta(cr, contract.pdb(name, role.role, role.revision), role.role,
                          role.pairing_key, role.revision),
        "spec": {"maxUnavailable": max_unavailable(role), "selector": selector,
                 # A crash-looping engine must not block a node drain.
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def container_ports(role: RolePlan) -> list[dict[str, Any]]:
    ports = role.ports
    out = [{"name": f"vllm-{i}", "containerPort": p} for i, p in enumerate(ports.http)]
    if ports.supervisor:
        out.append({"name": "supervisor", "containerPort": ports.supervisor})
    out += [{"name": f"nixl-{i}", "containerPort": p} for i, p in enumerate(ports.nixl)]
    return [{**p, "protocol": "TCP"} for p in out]


def _probes(role: RolePlan) -> dict[str, Any]:
    port = role.ports.health
    startup_budget = role.spec.engine.engineReadyTimeoutSeconds
    return {
        # Model loading takes tens of minutes: only the startup probe waits for it.
        "startupProbe": {"httpGet": {"path": "/health", "port": port},
                         "periodSeconds": PROBE_PERIOD_SECONDS,
                         "failureThreshold": -(-startup_budget // PROBE_PERIOD_SECONDS)},
        "livenessProbe": {"httpGet": {"path": "/health", "port": port},
                          "periodSeconds": PROBE_PERIOD_SECONDS, "failureThreshold": 3,
                          "timeoutSeconds": 5},
        "readinessProbe": {"httpGet": {"path": role.ports.ready_path, "port": port},
                           "periodSeconds": 5, "failureThreshold": 2, "timeoutSeconds": 3},
    }


def pod_security_level(spec: Any) -> str:
    """The strictest Pod Security Standard an engine pod meets. It meets "restricted"
    (non-root, no privilege escalation, every capability dropped, RuntimeDefault seccomp,
    no host namespaces or paths) unless RDMA is on: registering (pinning) host buffers with
    the RDMA device counts against the memlock limit unless the process holds IPC_LOCK, and
    neither restricted nor baseline lets a pod add IPC_LOCK."""
    return "privileged" if spec.kvTransfer.rdma else "restricted"


def engine_security_context(role: RolePlan) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if role.spec.kvTransfer.rdma:
        capabilities["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
            "runAsUser": contract.ENGINE_UID, "runAsGroup": contract.ENGINE_UID,
            "capabilities": capabilities, "seccompProfile": {"type": "RuntimeDefault"}}


def _env(role: RolePlan) -> list[dict[str, Any]]:
    env = [{"name": key, "valueFrom": {"fieldRef": {"fieldPath": path}}}
           for key, path in contract.DOWNWARD_ENV]
    # A uid without a passwd entry: HOME for the caches, USER for torch's getpass.getuser().
    env += [{"name": "HOME", "value": contract.ENGINE_HOME}, {"name": "USER", "value": "longctx"}]
    hf = role.spec.model.source.huggingFace
    if hf and hf.tokenSecretRef:
        env.append({"name": contract.ENV_HF_TOKEN, "valueFrom": {"secretKeyRef": {
            "name": hf.tokenSecretRef.name, "key": hf.tokenSecretRef.key}}})
    return env


def _resources(role: RolePlan) -> dict[str, Any]:
    memory = format_bytes(role.memory.request)
    if cpu_platform.is_cpu(role.spec):
        cores = str(role.spec.engine.cpu.coresPerPod)
        return {"requests": {"cpu": cores, "memory": memory},
                "limits": {"cpu": cores, "memory": memory}}
    gpus = role.layout.gpusPerPod
    limits: dict[str, Any] = {contract.GPU_RESOURCE: str(gpus),
                              "memory": format_bytes(role.memory.request)}
    rdma = role.spec.kvTransfer.rdma
    if rdma:
        limits[rdma.resource] = str(rdma.count)
    requests = {**limits, "cpu": str(CPU_PER_GPU * gpus)}
    return {"requests": requests, "limits": limits}


def _volumes(cr_name: str, role: RolePlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "engine-config",
         "configMap": {"name": contract.engine_configmap(cr_name, role.revision)}},
        # The CPU KV offload lives in /dev/shm; size it for every rank's cpu_bytes_to_use.
        {"name": "dshm", "emptyDir": {"medium": "Memory",
                                      "sizeLimit": format_bytes(role.memory.shm)}},
        {"name": "vllm-cache", "emptyDir": {}},
    ]
    mounts = [{"name": "engine-config", "mountPath": contract.CONFIG_DIR, "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "vllm-cache", "mountPath": contract.ENGINE_HOME}]
    pvc = role.spec.model.source.pvc
    if pvc:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claimName,
                                                                    "readOnly": True}})
        mount = {"name": "model", "mountPath": contract.MODEL_MOUNT, "readOnly": True}
        if pvc.subPath:
            mount["subPath"] = pvc.subPath
        mounts.append(mount)
    return volumes, mounts


def _affinity(cr_name: str, role: RolePlan) -> dict[str, Any]:
    out: dict[str, Any] = {} if cpu_platform.is_cpu(role.spec) else {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": "nvidia.com/gpu.product", "operator": "In",
                "values": [role.spec.placement.gpuProduct]}]}]}}}
    key, scaling = role.spec.placement.topologyKey, role.spec.scaling
    if key and role.role == "decode":
        # A decode pod joins the domain of a prefill pod of its revision; with as many
        # prefill as decode pods per unit, pod i of both roles is in unit i / perUnit, so
        # the pod index pairs them.
        same_unit = [contract.PAIRING_LABEL] + (
            [contract.POD_INDEX_LABEL] if scaling.prefillPerUnit == scaling.decodePerUnit else [])
        out["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": contract.selector_labels(cr_name, "prefill")},
            "matchLabelKeys": same_unit, "topologyKey": key}]}
    return out


def _spread(cr_name: str, role: RolePlan) -> dict[str, Any]:
    """With a topology key, a revision's prefill pods spread over the domains, so that each
    domain keeps room for the decode pods that follow its prefill pods (two prefill pods
    in one domain could leave their decode pods nowhere to go)."""
    key = role.spec.placement.topologyKey
    if not key or role.role != "prefill":
        return {}
    return {"topologySpreadConstraints": [{
        "maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": contract.selector_labels(cr_name, "prefill")},
        "matchLabelKeys": [contract.PAIRING_LABEL]}]}


def config_digest(cr: dict[str, Any], role: RolePlan) -> str:
    """The digest of the role's launch document: an edit of one role, or an operator whose
    rendering changed, restarts only that role's pods, through the StatefulSet's rolling
    update."""
    return content_digest(document(cr, role).to_json())[:16]


def template_digest(template: dict[str, Any]) -> str:
    return content_digest(json.dumps(template, sort_keys=True))[:16]


def statefulset(cr: dict[str, Any], role: RolePlan, router: Router,
                replicas: int | None = None) -> dict[str, Any]:
    """The role's StatefulSet, with `replicas` in place of the role's while a scale-down
    drains (drain.py)."""
    cr_name = cr["metadata"]["name"]
    spec = role.spec
    volumes, mounts = _volumes(cr_name, role)
    engine = {
        "name": contract.ENGINE_CONTAINER,
        "image": spec.engine.image,
        "command": [*contract.ENGINE_CONTAINER_COMMAND, contract.launch_path(role.role)],
        "env": _env(role),
        "ports": container_ports(role),
        "resources": _resources(role),
        "volumeMounts": mounts,
        "securityContext": engine_security_context(role),
        **_probes(role),
    }
    pod_spec: dict[str, Any] = {
        "containers": [engine],
        "volumes": volumes,
        "affinity": _affinity(cr_name, role),
        **_spread(cr_name, role),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "tolerations": [*([] if cpu_platform.is_cpu(spec) else [GPU_TOLERATION]),
                        *[dict(t) for t in spec.placement.tolerations]],
    }
    # The API server drops empty fields; rendering them would read as drift forever.
    for key in ("affinity", "tolerations"):
        if not pod_spec[key]:
            del pod_spec[key]
    if spec.placement.nodeSelector:
        pod_spec["nodeSelector"] = dict(spec.placement.nodeSelector)
    if spec.placement.priorityClassName:
        pod_spec["priorityClassName"] = spec.placement.priorityClassName
    annotations = {contract.ENGINE_CONFIG_ANNOTATION: config_digest(cr, role)}
    router.engine_pod(role, annotations, pod_spec)
    template = {"metadata": {"labels": contract.labels(cr_name, role.role, role.pairing_key,
                                                      pod_role_revision(role)),
                             "annotations": annotations},
                "spec": pod_spec}
    metadata = _meta(cr, contract.statefulset(cr_name, role.role, role.revision), role.role,
                     role.pairing_key, role.revision)
    metadata["annotations"] = {contract.TEMPLATE_DIGEST_ANNOTATION: template_digest(template)}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": role.replicas if replicas is None else replicas,
            "serviceName": contract.headless_service(cr_name, role.role),
            "podManagementPolicy": "Parallel",
            # In place (same revision): one pod at a time, within the PDB.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": contract.selector_labels(
                cr_name, role.role, role.pairing_key, pod_role_revision(role))},
            "template": template,
        },
    }


def revision_objects(cr: dict[str, Any], plan: ServingPlan, router: Router,
                     replicas: Mapping[str, int] = MappingProxyType({})
                     ) -> list[dict[str, Any]]:
    """The objects of the plan's revision: its config, then each role's pods (with what
    `router` needs on them; `replicas` by role while a scale-down drains) and PDB, named
    for the role's own role revision."""
    objects = engine_configmaps(cr, plan)
    for role in plan.roles:
        objects += [statefulset(cr, role, router, replicas.get(role.role)),
                    pod_disruption_budget(cr, role)]
    return objects


def shared_engine_objects(cr: dict[str, Any], plan: ServingPlan) -> list[dict[str, Any]]:
    """What every revision shares: each role's headless Service (pod DNS of all revisions)."""
    return [headless_service(cr, role) for role in plan.roles]


def pod_monitor(cr: dict[str, Any], plan: ServingPlan) -> dict[str, Any]:
    """Scrapes every vLLM rank's /metrics (monitoring.coreos.com/v1)."""
    names = sorted({p["name"] for role in plan.roles for p in container_ports(role)
                    if p["name"].startswith("vllm-")})
    cr_name = cr["metadata"]["name"]
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": _meta(cr, contract.pod_monitor(cr_name), contract.MONITORING_COMPONENT),
        "spec": {"selector": {"matchLabels": contract.serving_selector(cr_name)},
                 # The capacity rules (builders/autoscaling.py) select a CR's decode ranks
                 # by these labels.
                 "podTargetLabels": [contract.INSTANCE_LABEL, contract.COMPONENT_LABEL],
                 "podMetricsEndpoints": [{"port": n, "path": "/metrics"} for n in names]},
    }
