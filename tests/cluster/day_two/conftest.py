"""One real prefill/decode deployment shared by the day-two modules of this package.

An engine takes 40-120 s to start on 2 cores, so the package starts one CPU deployment (two
prefill pods, one decode pod, vllm-router; the tiny dense model, whose prefix caching the
CPU backend keeps on) and one operator, and its modules run against them in turn (pytest
runs them in file-name order):

- test_bench.py: `longctx bench` sweeps through the router;
- test_data_path_faults.py: engines killed and stopped on the data path (each comes back);
- test_disaggregation_threshold.py: new turns straight to decode against through prefill;
- test_prefix_reuse.py: multi-turn sessions with three routings over the two prefill pods,
  then named sessions with `spec.router.sessionAffinity: sessionId` (kept by the next module);
- test_traffic_rollouts.py: a scale-down, a Surge rollout and a decode-only edit under
  traffic, last, since they change the deployment.

Each module first waits for the deployment to be settled (`Deployment.settle`).
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.cluster.day_two.deployment import NAMESPACE, READY_TIMEOUT, Deployment
from tests.cluster.real_engines import RealEngines
from tests.conftest import SESSION_DIR, running_operator


@pytest.fixture(scope="package")
def operator(cluster) -> Iterator[Any]:
    """One operator for the package's modules, which share the deployment it manages."""
    with running_operator() as runner:
        yield runner


@pytest.fixture(scope="package")
def deployment(cluster, operator) -> Iterator[Deployment]:
    workdir = SESSION_DIR / "day-two"
    workdir.mkdir(parents=True, exist_ok=True)
    # Two loopback nodes: a drained node's pods have somewhere to go.
    with RealEngines(cluster.cp, workdir, nodes=2, octet=150) as real:
        served = Deployment(real, workdir / "cr.yaml")
        with real.deployed(served.cr, NAMESPACE, READY_TIMEOUT) as seconds:
            print(f"\n[day-two] Ready in {seconds:.0f} s")
            yield served
