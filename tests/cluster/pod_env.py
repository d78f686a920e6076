"""A pod's environment for the loopback kubelet (tests/cluster/pod_runner.py): the Downward
API's fields and resources, env and envFrom from ConfigMaps and Secrets, `$(VAR)` expansion."""

from __future__ import annotations

import base64
import json
import math
import re
from decimal import Decimal
from typing import TYPE_CHECKING

from tests.cluster.pod_process import PodSetupError

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


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
    data = object_data(obj, kind) if obj else None
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        what = f'{kind} "{ref["name"]}"' + (f' has no key "{ref["key"]}"' if data else
                                            " not found")
        raise PodSetupError("CreateContainerConfigError", what)
    return data[ref["key"]].decode(errors="replace")


def object_data(obj: dict, kind: str) -> dict[str, bytes]:
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
        for key, value in object_data(obj, kind.lower()).items():
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
