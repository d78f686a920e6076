"""Typed API objects that are their own OpenAPI schema.

An API object is a frozen dataclass whose fields are declared with `api_field`.
From that one declaration come: the CRD's structural schema (types, defaults,
bounds, descriptions for `kubectl explain`, CEL rules), and `load`, which turns
a manifest's dict into typed objects with the same defaults the API server
applies. Field names are the API's camelCase names, so there is no mapping layer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import types
import typing
from typing import Any, ClassVar

import celpy
from celpy import celtypes

from longctx_core.quantity import PATTERN as QUANTITY_PATTERN, PATTERN_OR_AUTO

_MISSING = dataclasses.MISSING


class Quantity(str):
    """A byte size written as a Kubernetes quantity ("48Gi") or an integer."""


class SizeOrAuto(Quantity):
    """A Quantity, or `auto`: the least size the planner proves enough (only the fields that
    declare this type accept `auto`)."""


class Preserved(dict):
    """A free-form object kept as is (e.g. a Kubernetes toleration)."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """A validation rule, declared once: `rule` is CEL, checked by the API server at apply and,
    by a CEL implementation (cel-python, RE2 for `matches`), offline on the same values.
    `message` names the field and the fix; `{self.path}` placeholders show the offending
    values."""

    rule: str
    message: str

    def holds(self, subject: Any) -> bool:
        """Evaluates the rule offline on a typed API object (or a field value), in its manifest
        form: a field left unset is absent, so `has()` means what it means on the API server.
        An evaluation error (a missing key, a division by zero) fails the rule, as there."""
        return _holds(self.rule, json.dumps(dump(subject), sort_keys=True))

    def compile(self) -> None:
        """Compiles the rule now, not at its first evaluation (a rule that is not CEL fails
        here)."""
        _program(self.rule)

    def render(self, subject: Any) -> str:
        """The message with its placeholders filled, as the API server renders it."""
        return _PLACEHOLDER.sub(lambda m: _cel_string(_resolve(subject, m.group(1))),
                                self.message)

    def cel(self) -> dict[str, str]:
        """The x-kubernetes-validations entry. Values are formatted with CEL's format(),
        whose cost the API server bounds (string() of an integer it does not)."""
        paths = _PLACEHOLDER.findall(self.message)
        if not paths:
            return {"rule": self.rule, "message": self.message}
        template = _PLACEHOLDER.sub("%s", self.message.replace("%", "%%"))
        return {"rule": self.rule,
                "messageExpression": f"{_cel_literal(template)}.format([{', '.join(paths)}])"}


_PLACEHOLDER = re.compile(r"\{(self(?:\.\w+)*)\}")


# The planner's search checks the same rules on mostly unchanged objects (a layout edits one
# role): evaluating CEL is what `plan --suggest` spends its time on.
@functools.lru_cache(maxsize=65536)
def _holds(rule: str, subject_json: str) -> bool:
    try:
        result = _program(rule).evaluate({"self": celpy.json_to_cel(json.loads(subject_json))})
    except celpy.CELEvalError:
        return False
    if not isinstance(result, celtypes.BoolType):
        raise TypeError(f"rule {rule!r} gives {type(result).__name__}, not a bool")
    return bool(result)


@functools.lru_cache(maxsize=None)
def _program(rule: str) -> celpy.Runner:
    """The rule compiled once; a rule that is not CEL fails here, at its first use."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _resolve(subject: Any, path: str) -> Any:
    value = subject
    for name in path.split(".")[1:]:
        value = value[name] if isinstance(value, dict) else getattr(value, name)
    return value


def _cel_string(value: Any) -> str:
    """What CEL's string() gives for a value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cel_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def api_field(doc: str, default: Any = _MISSING, *, minimum: int | None = None,
              maximum: int | None = None, enum: tuple[str, ...] | None = None,
              pattern: str | None = None, max_length: int | None = None,
              max_items: int | None = None, rules: tuple[Rule, ...] = ()) -> Any:
    """Declares one API field."""
    meta = dict(doc=doc, minimum=minimum, maximum=maximum, enum=enum, pattern=pattern,
                max_length=max_length, max_items=max_items, rules=rules)
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    if dataclasses.is_dataclass(default) or isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: _copy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value  # frozen dataclass instances are shared safely


class APIObject:
    """Base for API dataclasses: class docstring = description, CEL = object rules."""

    CEL: ClassVar[tuple[Rule, ...]] = ()


# ---------------------------------------------------------------- schema


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of an API class (resolving them compiles each one)."""
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _type_schema(tp: Any) -> dict[str, Any]:
    tp, _ = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int64"}
    if tp in (Quantity, SizeOrAuto):
        return {"x-kubernetes-int-or-string": True,
                "pattern": PATTERN_OR_AUTO if tp is SizeOrAuto else QUANTITY_PATTERN,
                "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if tp is str:
        return {"type": "string"}
    if tp is Preserved:
        return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        _, value = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(value)}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return object_schema(tp)
    raise TypeError(f"unsupported API type {tp!r}")


def _default_json(value: Any) -> Any:
    """A field default as JSON. A nested object's default is written out in full: the API
    server validates a default against the object's CEL rules before nested defaults apply."""
    if dataclasses.is_dataclass(value):
        return {f.name: _default_json(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not None}
    if isinstance(value, Quantity):
        return str(value)
    if isinstance(value, list):
        return [_default_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _default_json(v) for k, v in value.items()}
    return value


def object_schema(cls: type) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of an API dataclass."""
    hints = _type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    cel: list[dict[str, Any]] = [r.cel() for r in cls.CEL]
    for f in dataclasses.fields(cls):
        meta = f.metadata
        schema = dict(_type_schema(hints[f.name]))
        schema["description"] = meta["doc"]
        for key, name in (("minimum", "minimum"), ("maximum", "maximum"), ("enum", "enum"),
                          ("pattern", "pattern"), ("max_length", "maxLength"),
                          ("max_items", "maxItems")):
            if meta[key] is not None:
                schema[name] = list(meta[key]) if key == "enum" else meta[key]
        for r in meta["rules"]:
            schema.setdefault("x-kubernetes-validations", []).append(r.cel())
        if f.default is not _MISSING and f.default is not None:
            schema["default"] = _default_json(f.default)
        elif f.default_factory is not _MISSING:  # type: ignore[misc]
            schema["default"] = _default_json(f.default_factory())  # type: ignore[misc]
        elif f.default is _MISSING:
            required.append(f.name)
        props[f.name] = schema
    out: dict[str, Any] = {"type": "object", "description": (cls.__doc__ or "").strip(),
                           "properties": props}
    if required:
        out["required"] = required
    if cel:
        out["x-kubernetes-validations"] = cel
    return out


# ---------------------------------------------------------------- loading


class SpecError(ValueError):
    """A manifest that does not fit the API; the message names the field."""


def load(cls: type, data: Any, path: str = "spec") -> Any:
    """Builds typed API objects from a manifest dict, applying schema defaults."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected an object, got {type(data).__name__}")
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise SpecError(f"{path}: unknown field(s) {', '.join(unknown)}; "
                        f"known fields are {', '.join(sorted(names))}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}"
        if f.name in data and data[f.name] is not None:
            kwargs[f.name] = _load_value(hints[f.name], data[f.name], sub)
        elif f.default is _MISSING and f.default_factory is _MISSING:  # type: ignore[misc]
            raise SpecError(f"{sub} is required")
    return cls(**kwargs)


def _load_value(tp: Any, value: Any, path: str) -> Any:
    tp, _ = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp in (Quantity, SizeOrAuto):
        return tp(str(value))
    if tp is str:
        return str(value)
    if tp is Preserved:
        return Preserved(value)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(f"{path}: expected a list, got {value!r}")
        return [_load_value(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise SpecError(f"{path}: expected a map, got {value!r}")
        return {str(k): _load_value(item, v, f"{path}.{k}") for k, v in value.items()}
    return load(tp, value, path)


def dump(obj: Any) -> Any:
    """The manifest form of typed API objects (defaults included)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if getattr(obj, f.name) is not None}
    if isinstance(obj, list):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    if isinstance(obj, Quantity):
        return str(obj)
    return obj
