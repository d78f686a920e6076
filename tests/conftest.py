"""Shared fixtures: the real local control plane, the operator running in-process
against it, and a fresh namespace per test."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
for sub in ("core", "engine", "operator", "kernels"):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

from tests.cluster.controlplane import ControlPlane, ControlPlaneError  # noqa: E402
from tests.cluster.manifests import model_volume  # noqa: E402

# The kubernetes client reads KUBECONFIG once, at import, and Kopf logs in through it: fix
# the path before anything imports it; the session's control plane writes the file there.
SESSION_DIR = Path(tempfile.mkdtemp(prefix="longctx-cp-"))
os.environ["KUBECONFIG"] = str(SESSION_DIR / "kubeconfig")

EXAMPLE = REPO / "examples" / "glm-5.3-1m.yaml"
CRD_FILE = REPO / "crds" / "longctx.dev_longcontextdeployments.yaml"


# Every test's outcome, by node id: those recorded by earlier runs (pytest's cache), updated
# as this run goes. docs/reliability.md's "survived" column is counted from it
# (tests/reliability_doc.py), in this run by tests/test_reliability_doc.py and after it by
# `python -m tests.reliability_doc`.
OUTCOMES: dict[str, str] = {}
OUTCOMES_KEY = "longctx/outcomes"


def pytest_configure(config: pytest.Config) -> None:
    cache = getattr(config, "cache", None)
    OUTCOMES.clear()
    OUTCOMES.update(cache.get(OUTCOMES_KEY, {}) if cache is not None else {})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A failed or skipped setup or teardown decides the outcome as much as the call does.
    if report.when == "call" or report.outcome != "passed":
        OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    cache = getattr(session.config, "cache", None)
    if cache is not None:
        cache.set(OUTCOMES_KEY, OUTCOMES)


@pytest.fixture
def test_outcomes() -> dict[str, str]:
    return OUTCOMES


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """Polls until check() returns something truthy; fails with `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


class Cluster:
    """The running control plane plus helpers the tests share."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.kubeconfig = cp.kubeconfig
        self.bin_dir = cp.bin_dir
        self.share_dir = cp.share_dir

    def kubectl(self, *args: str, **kw: Any):
        return self.cp.kubectl(*args, **kw)

    def helm(self, *args: str, **kw: Any):
        return self.cp.helm(*args, **kw)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        proc = self.kubectl(*args, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def list(self, kind: str, namespace: str, selector: str | None = None) -> list[dict]:
        args = ["get", kind, "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
        return json.loads(self.kubectl(*args).stdout)["items"]

    def apply(self, manifest: dict | str, namespace: str, *extra: str):
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self.kubectl("apply", "-n", namespace, "-f", "-", *extra, input=text, check=False)

    def install_crds(self) -> None:
        files = [CRD_FILE, *sorted((self.share_dir / "crds").glob("*.yaml"))]
        for f in files:
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")


def revision_of(cr: dict) -> str:
    """The revision (NIXL pairing key) a CR's spec deploys."""
    from longctx_core.api.spec import load_spec
    from longctx_core.plan.revision import pairing_key
    return pairing_key(load_spec(cr["spec"]))


def sts_name(cr: dict, role: str) -> str:
    """The name of a role's StatefulSet for the CR's current spec."""
    from longctx_core import contract
    return contract.statefulset(cr["metadata"]["name"], role, revision_of(cr))


def example_cr(name: str = "glm", **spec_overrides: Any) -> dict:
    cr = yaml.safe_load(EXAMPLE.read_text())
    cr["metadata"]["name"] = name
    for path, value in spec_overrides.items():
        node = cr["spec"]
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return cr


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The real control plane. Never skipped: a failure to build or start it fails the tests."""
    try:
        cp = ControlPlane(nodes=int(os.environ.get("LONGCTX_TEST_NODES", "4")),
                          workdir=SESSION_DIR).start()
    except ControlPlaneError as exc:
        pytest.fail(f"the local control plane could not start: {exc}", pytrace=False)
    assert Path(os.environ["KUBECONFIG"]) == cp.kubeconfig
    c = Cluster(cp)
    print(f"\n[cluster] real kube-apiserver {cp.version()} at {cp.server}", file=sys.stderr)
    c.install_crds()
    try:
        yield c
    finally:
        cp.stop()
        if not os.environ.get("LONGCTX_KEEP_CLUSTER_DIR"):
            shutil.rmtree(SESSION_DIR, ignore_errors=True)


def kopf_settings():
    import kopf

    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    settings.execution.default_backoff = 1
    settings.networking.request_timeout = 30
    return settings


@contextlib.contextmanager
def running_operator() -> Iterator[Any]:
    """The operator, in-process (Kopf's runner), on the session's control plane."""
    from kopf.testing import KopfRunner

    from tests.cluster.pod_network import POD_NETWORK
    from tests.cluster.processes import free_port

    settings_env = {"LONGCTX_WATCH_SERVER_TIMEOUT": "10",
                    "LONGCTX_METRICS_PORT": str(free_port()),  # served on 127.0.0.1
                    # Only the loopback pods' engines run; kwok's pod IPs are not local.
                    "LONGCTX_ENGINE_METRICS_NETWORKS": str(POD_NETWORK)}
    os.environ.update(settings_env)
    try:
        with KopfRunner(["run", "--all-namespaces", "--standalone", "--verbose", "-m",
                         "longctx_operator.runtime.main"], settings=kopf_settings(),
                        timeout=60) as runner:
            time.sleep(2)  # the first watches are established
            yield runner
    finally:
        for key in settings_env:  # operators started later as processes must not inherit them
            os.environ.pop(key, None)
    assert runner.exception is None, runner.exception
    assert runner.exit_code == 0, runner.output[-3000:]


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Any]:
    """The operator for the tests of one module."""
    with running_operator() as runner:
        yield runner


@contextlib.contextmanager
def _test_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("apply", "-f", "-", input=model_volume(name))  # the example's PVC
    yield name
    # CRs first, while the operator still runs; then the namespace, without waiting.
    cluster.kubectl("delete", "lcd", "--all", "-n", name, "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "persistentvolume", f"models-{name}", "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with _test_namespace(cluster) as name:
        yield name


@pytest.fixture(scope="module")
def dry_run_namespace(cluster: Cluster) -> Iterator[str]:
    """One namespace for a module's server-side dry runs, which leave nothing in it."""
    with _test_namespace(cluster) as name:
        yield name
