"""Pure builders: a LongContextDeployment spec -> the engine objects of each role
(StatefulSet, headless Service, PodDisruptionBudget) and the engine ConfigMap."""

from __future__ import annotations

from typing import Any

from longctx_engine.api import LongContextDeploymentSpec
from longctx_engine.compat import pairing_key
from longctx_engine.engine_config import CONFIG_DIR, CONFIG_KEY, render_engine_config
from longctx_engine.quantity import format_bytes
from longctx_engine.recipes import (ENGINE_CONTAINER_COMMAND, MODEL_MOUNT, engine_ports,
                                    host_memory_bytes, shm_bytes)

from .. import naming
from .router import config_hash as content_hash
from .router import pod_annotations, routing_sidecar

# Loading weights after a crash is slow; vLLM drains in-flight requests on SIGTERM.
TERMINATION_GRACE_SECONDS = 120
PROBE_PERIOD_SECONDS = 10
# CPU cores per pod: tokenizers, API servers, the offload and HiSparse copy threads.
CPU_PER_GPU = 12


def _meta(cr: dict[str, Any], name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": cr["metadata"]["namespace"],
            "labels": naming.labels(cr["metadata"]["name"], component),
            "ownerReferences": [naming.owner_reference(cr)]}


def engine_configmap(cr: dict[str, Any], spec: LongContextDeploymentSpec) -> dict[str, Any]:
    meta = cr["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(cr, naming.engine_configmap(meta["name"]), "engine"),
            "data": {CONFIG_KEY: render_engine_config(meta["name"], meta["namespace"], spec)}}


def headless_service(cr: dict[str, Any], spec: LongContextDeploymentSpec, role: str
                     ) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(cr, naming.headless_service(name, role), role),
        "spec": {
            "clusterIP": "None",
            # Data-parallel ranks find pod 0 of their group before any pod is Ready.
            "publishNotReadyAddresses": True,
            "selector": naming.selector_labels(name, role),
            "ports": [{"name": p["name"], "port": p["containerPort"], "protocol": "TCP"}
                      for p in _container_ports(spec, role)],
        },
    }


def pod_disruption_budget(cr: dict[str, Any], role: str) -> dict[str, Any]:
    name = cr["metadata"]["name"]
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": _meta(cr, naming.pdb(name, role), role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": naming.selector_labels(name, role)},
                 # A crash-looping engine must not block a node drain.
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def _container_ports(spec: LongContextDeploymentSpec, role: str) -> list[dict[str, Any]]:
    ports = engine_ports(spec, role)
    out = [{"name": f"vllm-{i}", "containerPort": p} for i, p in enumerate(ports.http)]
    if ports.supervisor:
        out.append({"name": "supervisor", "containerPort": ports.supervisor})
    out += [{"name": f"nixl-{i}", "containerPort": p} for i, p in enumerate(ports.nixl)]
    return [{**p, "protocol": "TCP"} for p in out]


def _health_port(spec: LongContextDeploymentSpec, role: str) -> int:
    ports = engine_ports(spec, role)
    return ports.supervisor or ports.http[0]


def _probes(spec: LongContextDeploymentSpec, role: str) -> dict[str, Any]:
    port = _health_port(spec, role)
    ready_path = "/readyz" if engine_ports(spec, role).supervisor else "/health"
    startup_budget = spec.engine.engineReadyTimeoutSeconds
    return {
        # Model loading takes tens of minutes: only the startup probe waits for it.
        "startupProbe": {"httpGet": {"path": "/health", "port": port},
                         "periodSeconds": PROBE_PERIOD_SECONDS,
                         "failureThreshold": -(-startup_budget // PROBE_PERIOD_SECONDS)},
        "livenessProbe": {"httpGet": {"path": "/health", "port": port},
                          "periodSeconds": PROBE_PERIOD_SECONDS, "failureThreshold": 3,
                          "timeoutSeconds": 5},
        "readinessProbe": {"httpGet": {"path": ready_path, "port": port},
                           "periodSeconds": 5, "failureThreshold": 2, "timeoutSeconds": 3},
    }


def _env(spec: LongContextDeploymentSpec) -> list[dict[str, Any]]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    env = [field_ref("POD_NAME", "metadata.name"), field_ref("POD_NAMESPACE", "metadata.namespace"),
           field_ref("POD_IP", "status.podIP"),
           # The NIXL handshake listener binds and advertises the pod IP.
           field_ref("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP")]
    hf = spec.model.source.huggingFace
    if hf and hf.tokenSecretRef:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": hf.tokenSecretRef.name, "key": hf.tokenSecretRef.key}}})
    return env


def _resources(spec: LongContextDeploymentSpec, role: str) -> dict[str, Any]:
    gpus = getattr(spec, role).gpusPerPod
    memory = format_bytes(host_memory_bytes(spec, role))
    limits: dict[str, Any] = {"nvidia.com/gpu": str(gpus), "memory": memory}
    if spec.kvTransfer.rdma:
        limits[spec.kvTransfer.rdma.resource] = str(spec.kvTransfer.rdma.count)
    requests = {**limits, "cpu": str(CPU_PER_GPU * gpus)}
    return {"requests": requests, "limits": limits}


def _volumes(cr_name: str, spec: LongContextDeploymentSpec, role: str
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [
        {"name": "engine-config", "configMap": {"name": naming.engine_configmap(cr_name)}},
        # The CPU KV offload lives in /dev/shm; size it for every rank's cpu_bytes_to_use.
        {"name": "dshm", "emptyDir": {"medium": "Memory",
                                      "sizeLimit": format_bytes(shm_bytes(spec, role))}},
        {"name": "vllm-cache", "emptyDir": {}},
    ]
    mounts = [{"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "vllm-cache", "mountPath": "/root/.cache"}]
    pvc = spec.model.source.pvc
    if pvc:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claimName,
                                                                    "readOnly": True}})
        mount = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
        if pvc.subPath:
            mount["subPath"] = pvc.subPath
        mounts.append(mount)
    return volumes, mounts


def _affinity(spec: LongContextDeploymentSpec) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "nvidia.com/gpu.product", "operator": "In",
            "values": [spec.placement.gpuProduct]}]}]}}}


def config_hash(configmap: dict[str, Any]) -> str:
    """Changes whenever the engine config changes, so the pods roll."""
    return content_hash(configmap["data"][CONFIG_KEY])[:16]


def statefulset(cr: dict[str, Any], spec: LongContextDeploymentSpec, role: str,
                config_digest: str) -> dict[str, Any]:
    cr_name = cr["metadata"]["name"]
    role_spec = getattr(spec, role)
    volumes, mounts = _volumes(cr_name, spec, role)
    engine = {
        "name": "engine",
        "image": spec.engine.image,
        "command": [*ENGINE_CONTAINER_COMMAND, "--role", role, "--config",
                    f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "env": _env(spec),
        "ports": _container_ports(spec, role),
        "resources": _resources(spec, role),
        "volumeMounts": mounts,
        # Pinned host buffers (HiSparse pools, NIXL registration) need IPC_LOCK.
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
        **_probes(spec, role),
    }
    pod_spec: dict[str, Any] = {
        "containers": [engine],
        "volumes": volumes,
        "affinity": _affinity(spec),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        *[dict(t) for t in spec.placement.tolerations]],
    }
    if spec.placement.nodeSelector:
        pod_spec["nodeSelector"] = dict(spec.placement.nodeSelector)
    if spec.placement.priorityClassName:
        pod_spec["priorityClassName"] = spec.placement.priorityClassName
    annotations = {"longctx.dev/engine-config": config_digest}
    if spec.router.enabled:
        # The picker offers only the ports this pod serves (one per rank).
        annotations.update(pod_annotations(spec, role))
        if role == "decode":
            pod_spec["initContainers"] = [routing_sidecar(cr_name, spec)]
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": _meta(cr, naming.statefulset(cr_name, role), role),
        "spec": {
            "replicas": role_spec.replicas,
            "serviceName": naming.headless_service(cr_name, role),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "selector": {"matchLabels": naming.selector_labels(cr_name, role)},
            "template": {
                "metadata": {"labels": naming.labels(cr_name, role, pairing_key(spec)),
                             "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def engine_objects(cr: dict[str, Any], spec: LongContextDeploymentSpec) -> list[dict[str, Any]]:
    configmap = engine_configmap(cr, spec)
    digest = config_hash(configmap)
    objects = [configmap]
    for role in naming.ROLES:
        objects += [headless_service(cr, spec, role), statefulset(cr, spec, role, digest),
                    pod_disruption_budget(cr, role)]
    return objects


def pod_monitor(cr: dict[str, Any], spec: LongContextDeploymentSpec) -> dict[str, Any]:
    """Scrapes every vLLM rank's /metrics (monitoring.coreos.com/v1)."""
    names = sorted({p["name"] for role in naming.ROLES for p in _container_ports(spec, role)
                    if p["name"].startswith("vllm-")})
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": _meta(cr, cr["metadata"]["name"], "monitoring"),
        "spec": {"selector": {"matchLabels": naming.serving_selector(cr["metadata"]["name"])},
                 "podMetricsEndpoints": [{"port": n, "path": "/metrics"} for n in names]},
    }
