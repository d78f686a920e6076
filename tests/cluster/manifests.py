"""Objects the control plane does not make itself: simulated H200 nodes and the static
volume of the model weights."""

from __future__ import annotations

from typing import Any

import yaml


def h200_node(name: str) -> dict[str, Any]:
    """A kwok-managed node shaped like an 8x H200 server (2 x 56-core CPUs, 2 TiB RAM),
    labelled as GPU feature discovery labels one (product, count, memory in MiB)."""
    resources = {"cpu": "224", "memory": "2Ti", "pods": "110", "nvidia.com/gpu": "8",
                 "ephemeral-storage": "30Ti", "rdma/ib": "8"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H200",
                       "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "143771"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources,
                   "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                "kubeletVersion": "fake"}},
    }


def model_volume(namespace: str, claim: str = "models") -> str:
    """A pre-bound PersistentVolume and its claim: the weights the example mounts.
    The control plane has no provisioner, so the volume is static."""
    pv = f"{claim}-{namespace}"
    docs = [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
         "spec": {"capacity": {"storage": "2Ti"}, "accessModes": ["ReadOnlyMany"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                  "hostPath": {"path": "/mnt/models"},
                  "claimRef": {"namespace": namespace, "name": claim}}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": claim, "namespace": namespace},
         "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "2Ti"}}}},
    ]
    return "\n---\n".join(yaml.safe_dump(d) for d in docs)
