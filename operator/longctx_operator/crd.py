"""The LongContextDeployment CRD, generated from the typed API (engine/longctx_engine/api.py).

`longctx crd` prints it; crds/ and charts/longctx/crds/ hold the committed copies
and a test fails when either differs from what this module generates.
"""

from __future__ import annotations

from typing import Any

import yaml

from longctx_engine import api
from longctx_engine.schema import object_schema

CRD_NAME = f"{api.PLURAL}.{api.GROUP}"
CRD_FILE = f"{api.GROUP}_{api.PLURAL}.yaml"

_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string", "description": "CapacityPlanned, Accepted, PrefillReady, DecodeReady, "
                 "RouterReady, Ready, Progressing, Degraded or TopologySatisfiable."},
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
    },
}

# /scale counts P/D units (longctx_engine.scaling): `kubectl scale`, HPAs and KEDA write
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
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
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
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {"kind": api.KIND, "plural": api.PLURAL, "singular": api.SINGULAR,
                      "shortNames": list(api.SHORT_NAMES), "listKind": f"{api.KIND}List",
                      "categories": ["longctx"]},
            "versions": [{
                "name": api.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render_crd_yaml() -> str:
    header = ("# Generated by `longctx crd` from engine/longctx_engine/api.py. Do not edit;\n"
              "# run `make crds` after changing the API.\n")
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
