"""The project's kwok stages: how simulated pods become Ready.

Engine pods of real clusters take tens of minutes to load a model; the simulated ones
become Ready at once, except for two test images: LOAD_IMAGE becomes Ready after the
control plane's `load_seconds` (a model load), and CRASH_IMAGE never does (its engine
crash-loops). Everything else behaves like kwok's upstream fast stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

LOAD_IMAGE = "ghcr.io/longctx/engine:sim-load"
LOAD_IMAGE_2 = "ghcr.io/longctx/engine:sim-load-2"
CRASH_IMAGE = "ghcr.io/longctx/engine:sim-crash"
LOAD_IMAGES = (LOAD_IMAGE, LOAD_IMAGE_2)
IMAGE_KEY = ".spec.containers.[0].image"

_PENDING = [
    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
    {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
    {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
     "operator": "NotIn", "values": ["True"]},
]

_ADDRESSES = """\
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
startTime: {{ Now | Quote }}
"""

_RUNNING = """\
{{ $now := Now }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true,
   restartCount: 0, state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true,
   restartCount: 0, state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
phase: Running
""" + _ADDRESSES

# The engine exits at start again and again: the kubelet's CrashLoopBackOff, as it reports it.
_CRASHING = """\
{{ $now := Now }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 5
  state: {waiting: {reason: CrashLoopBackOff, message: "back-off restarting failed container"}}
  lastState: {terminated: {exitCode: 1, reason: Error, message: "simulated engine crash at start",
                           startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}
{{ end }}
phase: Running
""" + _ADDRESSES


def _stage(name: str, images: dict[str, Any], template: str, delay_ms: int = 0
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
        "selector": {"matchExpressions": [*_PENDING, {"key": IMAGE_KEY, **images}]},
        "next": {"statusTemplate": template},
    }
    if delay_ms:
        spec["delay"] = {"durationMilliseconds": delay_ms}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": spec}


def write_stages(directory: Path, load_seconds: float) -> list[Path]:
    """Writes the pod stages into `directory` and returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    special = [*LOAD_IMAGES, CRASH_IMAGE]
    stages = {
        "pod-ready": _stage("pod-ready", {"operator": "NotIn", "values": special}, _RUNNING),
        "engine-load": _stage("engine-load", {"operator": "In", "values": list(LOAD_IMAGES)},
                              _RUNNING, int(load_seconds * 1000)),
        "engine-crash": _stage("engine-crash", {"operator": "In", "values": [CRASH_IMAGE]},
                               _CRASHING),
    }
    paths = []
    for name, stage in stages.items():
        path = directory / f"{name}.yaml"
        path.write_text(yaml.safe_dump(stage, sort_keys=False))
        paths.append(path)
    return paths
