"""Validation of a spec, offline: the API's rule table plus what only the operator can judge.

Every `schema.Rule` declared on an API class (api.py) is CEL in the generated CRD, so the
API server refuses a violating manifest at apply, and the same CEL is evaluated here
(cel-python) on the typed spec, with the same message, for `longctx plan`/`render`, the engine
entrypoint and the operator. The checks below the table need what the API server does
not have: argv parsing of extraArgs, and byte quantities as numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any, Optional

from longctx_core.sizing import cpu_platform
from longctx_core.api.spec import NAME_RULE, LongContextDeploymentSpec, dump_spec, load_spec
from longctx_core.contract import ROLES
from longctx_core.plan.extra_args import extra_args_problems
from longctx_core.sizing.layout import role_layout
from longctx_core.sizing.memory import pod_memory
from longctx_core.quantity import AUTO, parse_bytes
from longctx_core.api.schema import APIObject, Rule


class RecipeError(ValueError):
    """A spec the engine refuses; the message names the spec field and the change to make."""


@functools.lru_cache(maxsize=None)
def table(cls: type = LongContextDeploymentSpec, path: str = "spec"
          ) -> tuple[tuple[str, Rule], ...]:
    """Every rule of the API, with the path of the object (or field) it applies to."""
    out: list[tuple[str, Rule]] = [(path, r) for r in cls.CEL]
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        sub = f"{path}.{f.name}"
        out += [(sub, r) for r in f.metadata["rules"]]
        tp = _unwrap(hints[f.name])
        if isinstance(tp, type) and issubclass(tp, APIObject):
            out += table(tp, sub)
    return tuple(out)


def compile_rules() -> None:
    """Compiles every rule of the API. The first compile builds cel-python's parser (about
    a second of CPU): a long-lived process does it at its start, not in its first checks."""
    for _, rule in table():
        rule.compile()
    NAME_RULE.compile()


def _unwrap(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is not None and len(args) == 1 else tp


def _at(spec: LongContextDeploymentSpec, path: str) -> Any:
    value: Any = spec
    for name in path.split(".")[1:]:
        value = getattr(value, name, None) if value is not None else None
    return value


def rule_violations(spec: LongContextDeploymentSpec) -> list[str]:
    """The message of every API rule the spec breaks, prefixed by the field's path."""
    return list(_violations(json.dumps(dump_spec(spec), sort_keys=True)))


# Once per distinct spec: every reconcile of an unchanged CR checks the same spec again, and
# preparing each rule's subject for CEL is most of a check.
@functools.lru_cache(maxsize=256)
def _violations(spec_json: str) -> tuple[str, ...]:
    spec = load_spec(json.loads(spec_json))
    out = []
    for path, rule in table():
        subject = _at(spec, path)
        if subject is not None and not rule.holds(subject):
            out.append(f"{path}: {rule.render(subject)}")
    return tuple(out)


def name_problem(cr_name: str) -> Optional[str]:
    subject = {"metadata": {"name": cr_name}}
    return None if NAME_RULE.holds(subject) else NAME_RULE.render(subject)


def problems(spec: LongContextDeploymentSpec, cr_name: Optional[str] = None) -> list[str]:
    """Everything the engine refuses in a spec, as messages naming the field to change."""
    out = rule_violations(spec)
    if cr_name is not None and name_problem(cr_name):
        out.append(name_problem(cr_name))
    for role in ROLES:
        try:
            pod_memory(spec, role_layout(spec, role), hisparse_pool=0)   # the pool: below
        except ValueError as e:
            out.append(str(e))
        out += extra_args_problems(spec, role)
    out += toleration_problems(spec)
    out += cpu_platform.problems(spec)
    out += _pool_problems(spec)
    return list(dict.fromkeys(out))


def _pool_problems(spec: LongContextDeploymentSpec) -> list[str]:
    """A HiSparse host pool that is not a positive quantity (`auto` is one)."""
    pool = spec.decode.hiSparse.hostPoolPerRank
    if not spec.decode.hiSparse.enabled or pool == AUTO:
        return []
    try:
        if parse_bytes(pool, "spec.decode.hiSparse.hostPoolPerRank") > 0:
            return []
    except ValueError as e:
        return [str(e)]
    return [f"spec.decode.hiSparse.hostPoolPerRank is {pool}; it must be positive with "
            "HiSparse (or set spec.decode.hiSparse.enabled to false)"]


# core/v1 Toleration: its fields and, for the enumerated ones, their values.
_TOLERATION_FIELDS = {"key": str, "operator": str, "value": str, "effect": str,
                      "tolerationSeconds": int}
_TOLERATION_VALUES = {"operator": ("Exists", "Equal"),
                      "effect": ("", "NoSchedule", "PreferNoSchedule", "NoExecute")}


def toleration_problems(spec: LongContextDeploymentSpec) -> list[str]:
    """spec.placement.tolerations are kept as written (free-form in the CRD) and copied into
    the pod template, where a bad one would fail the StatefulSet's apply: check them here."""
    out = []
    for i, tol in enumerate(spec.placement.tolerations):
        where = f"spec.placement.tolerations[{i}]"
        unknown = sorted(set(tol) - set(_TOLERATION_FIELDS))
        if unknown:
            out.append(f"{where} has unknown field(s) {', '.join(unknown)}; a toleration has "
                       f"{', '.join(_TOLERATION_FIELDS)}")
        for name, kind in _TOLERATION_FIELDS.items():
            value = tol.get(name)
            if value is None:
                continue
            if not isinstance(value, kind) or isinstance(value, bool):
                out.append(f"{where}.{name} is {value!r}; it must be a"
                           f"{'n integer' if kind is int else ' string'}")
            elif value not in _TOLERATION_VALUES.get(name, (value,)):
                out.append(f"{where}.{name} is {value!r}; it must be one of "
                           f"{', '.join(repr(v) for v in _TOLERATION_VALUES[name])}")
    return out


def validate(spec: LongContextDeploymentSpec, cr_name: Optional[str] = None) -> None:
    """Raises RecipeError listing every problem of the spec."""
    found = problems(spec, cr_name)
    if found:
        raise RecipeError("; ".join(found))
