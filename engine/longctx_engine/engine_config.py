"""The engine config file: what the operator mounts and `longctx-engine run` reads.

The operator renders it into ConfigMap `<cr>-engine`, key `engine.yaml`, mounted at
/etc/longctx. Its content is the CR's identity plus the full spec with defaults applied:

    name: glm
    namespace: default
    spec: {...}            # dump_spec(spec)

`read_engine_config` also accepts, for convenience outside a cluster, a ConfigMap manifest
holding that key, a LongContextDeployment manifest (e.g. examples/glm-5.3-1m.yaml), or a
multi-document stream with exactly one of those (the output of `longctx render`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .api import KIND, LongContextDeploymentSpec, dump_spec, load_spec
from .contract import CONFIG_KEY


class EngineConfigError(ValueError):
    """The engine config file cannot be read or does not fit the API."""


@dataclass(frozen=True)
class EngineConfig:
    cr_name: str
    namespace: str
    spec: LongContextDeploymentSpec


def config_yaml(doc: Any) -> str:
    """Block-style YAML of a config file, keys in order, through libyaml's emitter (PyYAML's
    pure-Python one was a tenth of the operator's CPU at a burst of new CRs)."""
    return yaml.dump(doc, Dumper=yaml.CSafeDumper, sort_keys=False, default_flow_style=False)


def render_engine_config(cr_name: str, namespace: str, spec: LongContextDeploymentSpec) -> str:
    """YAML text of the engine config (deterministic: same spec, same bytes)."""
    return _render(cr_name, namespace, json.dumps(dump_spec(spec)))


@functools.lru_cache(maxsize=4096)
def _render(cr_name: str, namespace: str, spec_json: str) -> str:
    """Every reconcile renders its CR's config to compare it with the live one; YAML
    emission is slow, so each distinct config is rendered once."""
    doc = {"name": cr_name, "namespace": namespace, "spec": json.loads(spec_json)}
    return config_yaml(doc)


def parse_engine_config(text: str, source: str = "<config>") -> EngineConfig:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise EngineConfigError(f"{source}: not valid YAML: {e}") from e
    if len(docs) > 1:   # e.g. the whole output of `longctx render`
        docs = [d for d in docs if isinstance(d, dict) and (
            d.get("kind") == KIND or (d.get("kind") == "ConfigMap"
                                      and CONFIG_KEY in (d.get("data") or {})))]
        if len(docs) != 1:
            raise EngineConfigError(f"{source}: expected exactly one ConfigMap with key "
                                    f"{CONFIG_KEY!r} or one {KIND} among its documents")
    doc = docs[0] if docs else None
    if not isinstance(doc, dict):
        raise EngineConfigError(f"{source}: expected a mapping with name, namespace and spec")
    if doc.get("kind") == "ConfigMap":
        data = (doc.get("data") or {}).get(CONFIG_KEY)
        if data is None:
            raise EngineConfigError(f"{source}: ConfigMap has no data key {CONFIG_KEY!r}")
        return parse_engine_config(data, f"{source}:data.{CONFIG_KEY}")
    if doc.get("kind") == KIND:
        meta: dict[str, Any] = doc.get("metadata") or {}
        name, namespace = meta.get("name"), meta.get("namespace") or "default"
    else:
        name, namespace = doc.get("name"), doc.get("namespace") or "default"
    if not name:
        raise EngineConfigError(f"{source}: missing the LongContextDeployment name "
                                "(key 'name', or metadata.name in a manifest)")
    try:
        spec = load_spec(doc.get("spec"))
    except ValueError as e:
        raise EngineConfigError(f"{source}: {e}") from e
    return EngineConfig(cr_name=str(name), namespace=str(namespace), spec=spec)


def read_engine_config(path: str | Path) -> EngineConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise EngineConfigError(f"cannot read engine config {p}: {e.strerror or e}") from e
    return parse_engine_config(text, str(p))
