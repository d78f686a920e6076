"""The benchmark as Kubernetes objects: a ConfigMap with the trace, and a Job that runs
`longctx bench` (the bench image: longctx plus the benchmark environment) against the
deployment's router Service, scraping its engines through their headless Services.

The Job prints the report as its last log line (`kubectl logs job/NAME | tail -1`).
"""

from __future__ import annotations

from typing import Any

import yaml

from longctx_core import contract
from longctx_core.plan.roles import ServingPlan

from longctx_operator.controller.routers import router_for

BENCH_IMAGE = "ghcr.io/longctx/bench:0.1.0"
TRACE_KEY = "trace.jsonl"
CORPUS_KEY = "corpus.txt"
CR_KEY = "deployment.yaml"     # the CR: GPUs and the prediction come from its plan
BENCH_DIR = "/etc/longctx-bench"
MODEL_DIR = "/models"
RESULTS_DIR = "/results"


def bench_name(cr_name: str) -> str:
    return f"{cr_name}-bench"


def engine_metrics_urls(cr: dict[str, Any], plan: ServingPlan) -> list[str]:
    """ROLE=URL per engine port of each role, through the role's headless Service (which
    resolves to every pod)."""
    meta = cr["metadata"]
    return [f"{role.role}=http://{contract.headless_service(meta['name'], role.role)}."
            f"{meta['namespace']}.svc:{port}"
            for role in plan.roles for port in role.ports.http]


def _labels(cr_name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "longctx", "app.kubernetes.io/instance": cr_name,
            "app.kubernetes.io/component": "bench"}


def render(cr: dict[str, Any], plan: ServingPlan, *, traces_jsonl: str, corpus: str | None,
           bench_args: list[str], url: str | None = None, tokenizer: str | None = None,
           image: str = BENCH_IMAGE) -> list[dict[str, Any]]:
    """The ConfigMap and the Job. `bench_args` are the run's own flags (concurrency,
    timeout, label); the endpoint, model, trace and engines are filled in here."""
    meta = cr["metadata"]
    name, namespace = bench_name(meta["name"]), meta["namespace"]
    spec = cr["spec"]
    model = spec["model"].get("servedName") or spec["model"]["name"]
    pvc = (spec["model"].get("source") or {}).get("pvc")
    if tokenizer is None and pvc is None:
        raise ValueError("spec.model.source has no pvc: pass --tokenizer with a path or "
                         "Hugging Face name the Job can load the model's tokenizer from")
    deployment = {k: cr[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in cr}
    data = {TRACE_KEY: traces_jsonl, CR_KEY: yaml.safe_dump(deployment, sort_keys=False)}
    if corpus is not None:
        data[CORPUS_KEY] = corpus
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": name, "namespace": namespace,
                              "labels": _labels(meta["name"])},
                 "data": data}
    args = ["bench", "-f", f"{BENCH_DIR}/{CR_KEY}", "--url", url or router_for(plan.spec).bench_url(cr["metadata"]["name"], cr["metadata"]["namespace"]),
            "--model", model,
            "--tokenizer", tokenizer or MODEL_DIR, "--trace", f"{BENCH_DIR}/{TRACE_KEY}",
            "--out", RESULTS_DIR, "--emit-json"]
    if corpus is not None:
        args += ["--corpus", f"{BENCH_DIR}/{CORPUS_KEY}"]
    for item in engine_metrics_urls(cr, plan):
        args += ["--engine-metrics", item]
    args += bench_args
    volumes = [{"name": "bench", "configMap": {"name": name}},
               {"name": "results", "emptyDir": {}}]
    mounts = [{"name": "bench", "mountPath": BENCH_DIR, "readOnly": True},
              {"name": "results", "mountPath": RESULTS_DIR}]
    if tokenizer is None:
        volumes.append({"name": "model", "persistentVolumeClaim": {
            "claimName": pvc["claimName"], "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True,
                       **({"subPath": pvc["subPath"]} if pvc.get("subPath") else {})})
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(meta["name"])},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 86400,
            "template": {
                "metadata": {"labels": _labels(meta["name"])},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "bench", "image": image, "args": args,
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "volumeMounts": mounts,
                        "resources": {"requests": {"cpu": "2", "memory": "2Gi"},
                                      "limits": {"memory": "8Gi"}},
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": False,
                                            "capabilities": {"drop": ["ALL"]}},
                    }],
                    "volumes": volumes,
                },
            },
        },
    }
    return [configmap, job]
