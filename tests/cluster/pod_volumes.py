"""A pod's volumes for the loopback kubelet (tests/cluster/pod_runner.py): written on disk
(ConfigMaps, Secrets, the Downward API, projected sources, emptyDirs, claims bound to host
folders) and bind-mounted at their mount paths inside the container's mount namespace."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.cluster.pod_env import field_value, object_data, parse_quantity
from tests.cluster.pod_process import TOOLS, PodSetupError


@dataclass
class Volume:
    path: Path                  # on the host (or, for tmpfs, inside the pod's sandbox)
    read_only: bool = False
    tmpfs_bytes: int | None = None   # a memory-backed emptyDir: a tmpfs of this size


def _write_items(directory: Path, data: dict[str, bytes], items: list | None, mode: int,
                 optional: bool, what: str) -> None:
    for item in items or [{"key": k, "path": k} for k in data]:
        if item["key"] not in data:
            if optional:
                continue
            raise PodSetupError("ContainerCreating", f'{what} has no key "{item["key"]}"')
        target = directory / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data[item["key"]])
        target.chmod(item.get("mode", mode))


def _write_source(kube: Kube, pod: dict, directory: Path, kind: str, src: dict,
                  mode: int) -> None:
    """One configMap, secret, downwardAPI or serviceAccountToken source, written as files."""
    ns, meta = pod["metadata"]["namespace"], pod["metadata"]
    if kind in ("configMap", "secret"):
        name = src.get("name") or src.get("secretName")
        obj = kube.get(f"/api/v1/namespaces/{ns}/{kind.lower()}s/{name}")
        if obj is None:
            if src.get("optional"):
                return
            raise PodSetupError("ContainerCreating", f'{kind} "{name}" not found (FailedMount)')
        _write_items(directory, object_data(obj, kind.lower()), src.get("items"), mode,
                     bool(src.get("optional")), f'{kind} "{name}"')
    elif kind == "downwardAPI":
        for item in src.get("items", []):
            if "fieldRef" not in item:
                raise PodSetupError("ContainerCreating", f"unsupported downwardAPI {item}")
            data = {"v": field_value(pod, item["fieldRef"]["fieldPath"]).encode()}
            _write_items(directory, data, [{"key": "v", **item}], mode, False, "downwardAPI")
    elif kind == "serviceAccountToken":
        sa = pod["spec"].get("serviceAccountName", "default")
        spec: dict[str, Any] = {"expirationSeconds": src.get("expirationSeconds", 3607),
                                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                                   "name": meta["name"], "uid": meta["uid"]}}
        if src.get("audience"):
            spec["audiences"] = [src["audience"]]
        resp = kube.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": spec})
        data = {"t": resp["status"]["token"].encode()}
        _write_items(directory, data, [{"key": "t", "path": src["path"]}], mode, False, "token")
    else:
        raise PodSetupError("ContainerCreating", f"unsupported projected source {kind}")


def prepare_volumes(kube: Kube, pod: dict, pod_dir: Path, volume_map: dict[str, Path]
                    ) -> dict[str, Volume]:
    """Materializes the pod's volumes under pod_dir/volumes; returns them by name."""
    out: dict[str, Volume] = {}
    for vol in pod["spec"].get("volumes", []):
        name, directory = vol["name"], pod_dir / "volumes" / vol["name"]
        directory.mkdir(parents=True, exist_ok=True)
        out[name] = Volume(directory)
        if "emptyDir" in vol:
            ed = vol["emptyDir"] or {}
            if ed.get("medium") == "Memory":
                size = ed.get("sizeLimit")
                out[name].tmpfs_bytes = int(parse_quantity(size)) if size else 0
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            if claim not in volume_map:
                raise PodSetupError("ContainerCreating", f'PersistentVolumeClaim "{claim}" is not '
                                    f"in the PodRunner volume_map (mapped: {sorted(volume_map)})")
            out[name] = Volume(Path(volume_map[claim]),
                               bool(vol["persistentVolumeClaim"].get("readOnly")))
        elif "hostPath" in vol:
            host = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                host.mkdir(parents=True, exist_ok=True)
            out[name] = Volume(host)
        elif "projected" in vol:
            mode = vol["projected"].get("defaultMode", 0o644)
            for src in vol["projected"].get("sources", []):
                (kind, body), = src.items()
                _write_source(kube, pod, directory, kind, body, mode)
        elif kinds := [k for k in ("configMap", "secret", "downwardAPI") if k in vol]:
            body = vol[kinds[0]]
            _write_source(kube, pod, directory, kinds[0], body, body.get("defaultMode", 0o644))
        else:
            kind = next(k for k in vol if k != "name")
            raise PodSetupError("ContainerCreating", f'volume "{name}": {kind} volumes are not '
                                "supported by the loopback kubelet")
    return out


ETC_HOSTS = "etc-hosts.kubelet"   # not a DNS label: no volume of a pod can have this name


def etc_hosts(pod_dir: Path, ip: str, hostname: str) -> Volume:
    """The kubelet's /etc/hosts for a pod: its hostname resolves to its IP."""
    path = pod_dir / "etc-hosts"
    path.write_text("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"
                    "::1\tlocalhost ip6-localhost ip6-loopback\n"
                    f"{ip}\t{hostname}\n")
    return Volume(path)


def with_etc_hosts(c: dict) -> dict:
    """The container with the pod's /etc/hosts mounted, unless it mounts one itself."""
    mounts = c.get("volumeMounts", [])
    if any(m["mountPath"].rstrip("/") == "/etc/hosts" for m in mounts):
        return c
    return {**c, "volumeMounts": [*mounts, {"name": ETC_HOSTS, "mountPath": "/etc/hosts"}]}


def mount_script(c: dict, volumes: dict[str, Volume]) -> list[str]:
    """The bash lines that bind-mount the container's volumeMounts, parents before children.

    Every source is opened first and mounted through /proc/self/fd, so a volume mounted
    over a folder that holds another volume's source (an emptyDir at /tmp over the
    runner's workdir) hides nothing. Each mount point is created just before its mount,
    inside the container's mount namespace: on the host's filesystem when nothing covers
    it (the namespace shares it; it stays after the test), inside the volume when one does."""
    q = shlex.quote
    mounts = sorted(c.get("volumeMounts", []), key=lambda m: m["mountPath"].count("/"))
    opens, lines = [], []
    for fd, m in enumerate(mounts, start=3):
        if m["name"] not in volumes:
            raise PodSetupError("CreateContainerConfigError", f'no volume "{m["name"]}"')
        vol = volumes[m["name"]]
        src = vol.path / m["subPath"] if m.get("subPath") else vol.path
        if not src.exists() and vol.tmpfs_bytes is None:
            src.mkdir(parents=True)           # the kubelet creates a missing subPath
        target = q(m["mountPath"])
        opens.append(f"{fd}<{q(str(src))}")
        if src.is_file():
            lines.append(f"{TOOLS['mkdir']} -p -- \"$({TOOLS['dirname']} -- {target})\"; "
                         f"[ -e {target} ] || : > {target}")
        else:
            lines.append(f"{TOOLS['mkdir']} -p -- {target}")
        lines.append(f"{TOOLS['mount']} --no-canonicalize --bind /proc/self/fd/{fd} {target}")
        if m.get("readOnly") or vol.read_only:
            lines.append(f"{TOOLS['mount']} -o remount,bind,ro {target}")
    if not opens:
        return []
    return [f"exec {' '.join(opens)}", *lines,
            "exec " + " ".join(f"{fd}<&-" for fd in range(3, 3 + len(opens)))]
