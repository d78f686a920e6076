"""The per-pod part of the loopback kubelet (tests/cluster/pod_runner.py): a pod's
environment variables, its volumes on disk, its sandbox and container processes, probes.

Each pod gets a sandbox process (the pause container's role) holding a private mount, UTS
and network namespace: memory-backed emptyDirs are tmpfs mounts there, shared by every
container of the pod, and tests/cluster/pod_network.py gives the network namespace its
`eth0`. Each container enters it, unshares a mount namespace of its own, bind-mounts its
volumes at their mount paths and execs its command, so nothing is mounted on the host.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster.pod_runner import Kube

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOLS = {t: shutil.which(t, path=SYSTEM_PATH) or t
         for t in ("unshare", "nsenter", "setpriv", "mount", "hostname", "sleep", "sh", "bash",
                   "mkdir", "dirname")}
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


class PodSetupError(RuntimeError):
    """The pod cannot start yet; `reason` is the kubelet's waiting reason for it."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("1Mi", "500m", "2") as a number."""
    text = str(value).strip()
    match = re.fullmatch(r"([0-9.eE+-]+?)([KMGTPE]i|[numkMGTPE]?)", text)
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    return Decimal(match.group(1)) * Decimal(_SUFFIX[match.group(2)])


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: $$ escapes, undefined references stay as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            end = text.find(")", i + 2) if nxt == "(" else -1
            if nxt == "$":
                out.append("$")
                i += 2
            elif end != -1:
                name = text[i + 2:end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
            else:
                out.append("$" + nxt)
                i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# ------------------------------------------------------------------ downward API and env


def field_value(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in items)
    simple = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
              "status.hostIP": status.get("hostIP", ""), "status.podIP": status.get("podIP", ""),
              "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs", [])),
              "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs", []))}
    if path not in simple:
        raise PodSetupError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")
    return simple[path]


def resource_value(pod: dict, node: dict, ref: dict, default_container: str) -> str:
    """resourceFieldRef: the limit (or the node's allocatable when unset), over the divisor,
    rounded up as the kubelet does."""
    name = ref.get("containerName") or default_container
    c = next(c for c in pod["spec"]["containers"] if c["name"] == name)
    kind, _, res = ref["resource"].partition(".")
    value = (c.get("resources", {}).get(kind) or {}).get(res)
    if value is None:
        value = node.get("status", {}).get("allocatable", {}).get(res, "0")
    divisor = parse_quantity(ref.get("divisor", "1"))
    return str(math.ceil(parse_quantity(value) / divisor))


def _key_ref(kube: Kube, ns: str, kind: str, ref: dict) -> str | None:
    obj = kube.get(f"/api/v1/namespaces/{ns}/{kind}s/{ref['name']}")
    data = _object_data(obj, kind) if obj else None
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = f'{kind} "{ref["name"]}"' + (f' has no key "{ref["key"]}"' if data else
                                            " not found")
        raise PodSetupError("CreateContainerConfigError", what)
    return data[ref["key"]].decode(errors="replace")


def _object_data(obj: dict, kind: str) -> dict[str, bytes]:
    if kind == "secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def container_env(kube: Kube, pod: dict, node: dict, c: dict, base: dict[str, str]
                  ) -> dict[str, str]:
    """The container's environment, built in the kubelet's order: the image's, envFrom,
    then env (each value expanded against what came before)."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in c.get("envFrom", []):
        kind = "configMap" if "configMapRef" in src else "secret"
        ref = src[f"{kind}Ref"]
        obj = kube.get(f"/api/v1/namespaces/{ns}/{kind.lower()}s/{ref['name']}")
        if obj is None:
            if ref.get("optional"):
                continue
            raise PodSetupError("CreateContainerConfigError",
                                f'{kind.lower()} "{ref["name"]}" not found')
        for key, value in _object_data(obj, kind.lower()).items():
            if _ENV_NAME.match(src.get("prefix", "") + key):
                env[src.get("prefix", "") + key] = value.decode(errors="replace")
    for var in c.get("env", []):
        src = var.get("valueFrom")
        if src is None:
            env[var["name"]] = expand(var.get("value", ""), env)
            continue
        if "fieldRef" in src:
            value = field_value(pod, src["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in src:
            value = resource_value(pod, node, src["resourceFieldRef"], c["name"])
        elif "configMapKeyRef" in src:
            value = _key_ref(kube, ns, "configmap", src["configMapKeyRef"])
        elif "secretKeyRef" in src:
            value = _key_ref(kube, ns, "secret", src["secretKeyRef"])
        else:
            raise PodSetupError("CreateContainerConfigError", f"unsupported env source {src}")
        if value is not None:
            env[var["name"]] = value
    return env


# ------------------------------------------------------------------ volumes


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
        _write_items(directory, _object_data(obj, kind.lower()), src.get("items"), mode,
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


# ------------------------------------------------------------------ processes


def _spawn(argv: list[str], env: dict[str, str] | None, log: Path | None, cwd: str = "/"
           ) -> subprocess.Popen:
    """In its own process group; SIGKILLed if the thread that started it dies (a test run
    killed mid-way leaves nothing running). Threads that spawn live until the process ends."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    try:
        return subprocess.Popen([TOOLS["setpriv"], "--pdeathsig", "KILL", "--", *argv],
                                env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        if log:
            out.close()


def start_sandbox(hostname: str, volumes: dict[str, Volume], log: Path) -> subprocess.Popen:
    """The pod's pause process: its namespaces hold the pod's hostname, tmpfs volumes and
    network (empty until the harness attaches the pod's veth)."""
    script = [f"{TOOLS['hostname']} {shlex.quote(hostname)}"]
    for vol in volumes.values():
        if vol.tmpfs_bytes is not None:
            size = f",size={vol.tmpfs_bytes}" if vol.tmpfs_bytes else ""
            script.append(f"{TOOLS['mount']} -t tmpfs -o mode=1777{size} tmpfs "
                          f"{shlex.quote(str(vol.path))}")
    script.append(f"echo sandbox-ready; exec {TOOLS['sleep']} infinity")
    offset = log.stat().st_size if log.exists() else 0   # a retried sandbox appends
    proc = _spawn([TOOLS["unshare"], "--mount", "--uts", "--net", "--propagation", "private",
                   "--", TOOLS["sh"], "-ec", "\n".join(script)], {"PATH": SYSTEM_PATH}, log)
    deadline = time.monotonic() + 10
    while b"sandbox-ready" not in log.read_bytes()[offset:]:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc, 0)
            raise PodSetupError("CreateContainerError", f"pod sandbox failed: "
                                f"{log.read_text(errors='replace')[-500:]}")
        time.sleep(0.02)
    return proc


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


def start_container(sandbox_pid: int, argv: list[str], env: dict[str, str], cwd: str,
                    mounts: list[str], log: Path) -> subprocess.Popen:
    """nsenter the sandbox, unshare a mount namespace of the container's own, mount, exec:
    one process id all along, which is the container's process-group leader."""
    script = "\n".join([*mounts, 'exec "$@"'])
    return _spawn([TOOLS["nsenter"], f"--target={sandbox_pid}", "--mount", "--uts", "--net",
                   "--", TOOLS["unshare"], "--mount", "--propagation", "private", "--",
                   TOOLS["bash"], "-ec", script, "container", *argv], env, log, cwd)


def stop_process(proc: subprocess.Popen | None, grace: float) -> int | None:
    """SIGTERM to the process group, SIGKILL after `grace` seconds; the exit status."""
    if proc is None:
        return None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    return proc.returncode


# ------------------------------------------------------------------ probes


def run_probe(probe: dict, c: dict, pod_ip: str, pid: int, env: dict[str, str]) -> bool:
    """One httpGet, tcpSocket or exec probe attempt, as the kubelet runs it."""
    timeout = probe.get("timeoutSeconds", 1)

    def port_of(spec: dict) -> int:
        port = spec["port"]
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return next(p["containerPort"] for p in c.get("ports", []) if p.get("name") == port)

    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            cls = http.client.HTTPSConnection if h.get("scheme") == "HTTPS" else \
                http.client.HTTPConnection
            kw = {"context": ssl._create_unverified_context()} if h.get("scheme") == "HTTPS" else {}
            conn = cls(h.get("host") or pod_ip, port_of(h), timeout=timeout, **kw)
            try:
                conn.request("GET", h.get("path", "/"), headers={
                    "User-Agent": "kube-probe/1.37", **{x["name"]: x["value"]
                                                        for x in h.get("httpHeaders", [])}})
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in probe:
            t = probe["tcpSocket"]
            with socket.create_connection((t.get("host") or pod_ip, port_of(t)), timeout):
                return True
        if "exec" in probe:
            argv = [TOOLS["nsenter"], f"--target={pid}", "--mount", "--uts", "--net", "--",
                    *probe["exec"]["command"]]
            return subprocess.run(argv, env=env, capture_output=True, timeout=timeout,
                                  start_new_session=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired, http.client.HTTPException, StopIteration):
        return False
    return False   # grpc probes: not supported, they fail
