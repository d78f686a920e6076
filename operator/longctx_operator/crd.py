"""The LongContextDeployment CRD, generated from the typed API (core/longctx_core/api/spec.py).

`longctx crd` prints it; crds/ and charts/longctx/crds/ hold the committed copies
and a test fails when either differs from what this module generates.
"""

from __future__ import annotations

from typing import Any

import yaml

from longctx_core import contract
from longctx_core.api import spec as api
from longctx_core.api.schema import object_schema

CRD_NAME = f"{contract.PLURAL}.{contract.GROUP}"
CRD_FILE = f"{contract.GROUP}_{contract.PLURAL}.yaml"

_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string", "description": "CapacityPlanned, Accepted, PrefillReady, "
                 "DecodeReady, RouterReady, RolloutBlocked, TopologySatisfiable, Ready, Progressing "
                 "or Degraded."},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string", "description": "One CamelCase word."},
        "message": {"type": "string", "description": "What is wrong and what to change."},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer", "format": "int64"},
    },
}

_ROLE_STATUS = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "description": "Desired pods."},
        "readyReplicas": {"type": "integer", "description": "Pods Ready."},
        "updatedReplicas": {"type": "integer", "description": "Pods at the current revision."},
        "summary": {"type": "string", "description": "ready/desired, for printing."},
    },
}

_READY_BY_ROLE = {"type": "object", "additionalProperties": {"type": "integer"},
                  "description": "Ready pods by role."}
_ROLLOUT_STATUS = {
    "type": "object",
    "description": "The last rollout between revisions (see docs/operator.md#rollouts).",
    "properties": {
        "strategy": {"type": "string", "description": "Surge or Recreate."},
        "phase": {"type": "string", "description": "Steady, Progressing, Blocked, Failed, "
                  "Draining or Recreating."},
        "from": {"type": "string", "description": "The revision that served before."},
        "to": {"type": "string", "description": "The desired revision."},
        "serving": {"type": "string", "description": "The revision the router selects."},
        "startTime": {"type": "string", "format": "date-time"},
        "switchTime": {"type": "string", "format": "date-time",
                       "description": "When the router switched to the new revision."},
        "drainUntil": {"type": "string", "format": "date-time",
                       "description": "When the old revision's pods are removed."},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "expectedDowntime": {"type": "string", "description": "Recreate: what it costs."},
        "reason": {"type": "string", "description": "Why a role's pods are replaced beside "
                   "the serving ones: a role of one pod changes or is on a node being "
                   "drained."},
        "roles": {"type": "array", "items": {"type": "string"},
                  "description": "The roles whose pods a replacement within the revision "
                  "(pairing key) swaps; the other role keeps its pods."},
        "cost": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "description": "What the change does, said when it started: how each role "
                 "rolls, runningGPUs, peakGPUs and lostPrefixTokens (prefill's CPU tier)."},
        "readyReplicas": {"type": "object", "additionalProperties": _READY_BY_ROLE,
                          "description": "Ready pods of each role, by revision."},
    },
}

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Observed state, written by the operator only.",
    # Kopf keeps its own progress under status.kopf; without this the API server prunes it.
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "observedGeneration": {"type": "integer", "format": "int64",
                               "description": "The spec generation this status describes."},
        "phase": {"type": "string", "description": "Pending, Progressing, Ready, Degraded or "
                  "Refused."},
        "conditions": {"type": "array", "items": _CONDITION,
                       "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        "plan": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "description": "The capacity plan (bytes, GiB = 2^30 bytes, tokens)."},
        "prefill": _ROLE_STATUS,
        "decode": _ROLE_STATUS,
        "maxContextTokens": {"type": "integer", "description": "The context the plan proved."},
        "endpoint": {"type": "string", "description": "Where clients send requests."},
        "replicas": {"type": "integer", "format": "int32",
                     "description": "P/D units whose pods exist (the /scale status)."},
        "selector": {"type": "string",
                     "description": "Label selector of the serving pods (the /scale status)."},
        "revision": {"type": "string", "description": "The serving revision (the NIXL "
                     "pairing key of its spec)."},
        "rollout": _ROLLOUT_STATUS,
        "rolloutCause": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                         "description": "What started the last change of the engines: "
                         "cause spec (an edit) or operator (an operator whose rendering of "
                         "the same spec changed), the roles, and a message."},
    },
}

# /scale counts P/D units (longctx_core.sizing.scaling): `kubectl scale`, HPAs and KEDA write
# spec.replicas and read the units running and the pods' selector from the status.
SCALE_SUBRESOURCE = {"specReplicasPath": ".spec.replicas",
                     "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}

PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary",
     "description": "ready/desired prefill pods"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary",
     "description": "ready/desired decode pods"},
    {"name": "Max-Context", "type": "integer", "jsonPath": ".spec.maxContextTokens"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint",
     "description": "where clients send requests"},
    {"name": "Rollout", "type": "string", "jsonPath": ".status.rollout.phase",
     "description": "Steady, Progressing, Blocked, Failed, Draining or Recreating"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
    {"name": "Revision", "type": "string", "jsonPath": ".status.revision", "priority": 1,
     "description": "the serving revision"},
    {"name": "Capacity", "type": "integer",
     "jsonPath": ".status.plan.decode.maxConcurrentAtMaxContext", "priority": 1,
     "description": "max-context requests decode holds at once"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    root = {
        "type": "object",
        "description": api.LongContextDeploymentSpec.__doc__.strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": object_schema(api.LongContextDeploymentSpec),
            "status": STATUS_SCHEMA,
        },
        "x-kubernetes-validations": [api.NAME_RULE.cel()],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME,
                     "labels": {"app.kubernetes.io/name": "longctx",
                                "app.kubernetes.io/part-of": "longctx"}},
        "spec": {
            "group": contract.GROUP,
            "scope": "Namespaced",
            "names": {"kind": contract.KIND, "plural": contract.PLURAL, "singular": api.SINGULAR,
                      "shortNames": list(api.SHORT_NAMES), "listKind": f"{contract.KIND}List",
                      "categories": ["longctx"]},
            "versions": [{
                "name": contract.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render_crd_yaml() -> str:
    header = ("# Generated by `longctx crd` from core/longctx_core/api/spec.py. Do not edit;\n"
              "# run `make crds` after changing the API.\n")
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
