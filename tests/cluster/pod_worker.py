"""One pod under the loopback kubelet (tests/cluster/pod_runner.py): its init containers,
sidecars and containers, their probes and restarts, and the status the kubelet writes.

Threads: the pod's own thread (sandbox, init containers, the end of the pod) and one per
sidecar or container. A process is started and waited for by the same thread, which lives
until the process is gone (its parent-death signal is tied to that thread).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

from tests.cluster.pod_network import PodNetworkError, netns_inode
from tests.cluster.pod_env import container_env, expand
from tests.cluster.pod_process import (PodSetupError, run_probe, start_container, start_sandbox,
                                       stop_process)
from tests.cluster.pod_status import (HOST_IP, ContainerRun, PodConditions, log_tail,
                                      now)
from tests.cluster.pod_volumes import (ETC_HOSTS, etc_hosts, mount_script, prepare_volumes,
                                       with_etc_hosts)

if TYPE_CHECKING:
    from tests.cluster.pod_runner import PodRunner

PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
                  "successThreshold": 1, "failureThreshold": 3}


def pod_hostname(pod: dict) -> str:
    return (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63]


def delete_pod(kube: Any, pod: dict) -> None:
    """The kubelet's last word on a terminated pod: delete it with grace 0, only if it is
    still the same pod (uid precondition)."""
    meta = pod["metadata"]
    try:
        kube.call("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                  {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                   "preconditions": {"uid": meta["uid"]}})
    except Exception as exc:
        if getattr(exc, "code", None) not in (404, 409):
            print(f"[pod-runner] deleting {meta['namespace']}/{meta['name']}: {exc!r}",
                  file=sys.stderr)


class PodWorker:
    def __init__(self, runner: "PodRunner", pod: dict):
        self.runner, self.pod = runner, pod
        meta = pod["metadata"]
        self.uid, self.ns, self.name = meta["uid"], meta["namespace"], meta["name"]
        self.dir = runner.workdir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        spec = pod["spec"]
        self.policy = spec.get("restartPolicy", "Always")
        self.inits = [ContainerRun(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
                      for c in spec.get("initContainers", [])]
        self.mains = [ContainerRun(c, "main") for c in spec["containers"]]
        self.lock = threading.RLock()
        self.stopping = threading.Event()       # the pod is being deleted, or the runner stops
        self.sidecars_stop = threading.Event()  # the pod finished: its sidecars end
        self.api = True                         # False: the pod is gone, or the runner stops
        self.grace = self._grace(spec.get("terminationGracePeriodSeconds", 30))
        self.ip = ""
        self.sandbox = None
        self.netns: int | None = None           # the inode of the pod's network namespace
        self.volumes: dict = {}
        self.initialized = False
        self.network_gone = True
        self.phase, self.reason, self.message = "Pending", None, None
        self.start_time = now()
        self.conditions = PodConditions()
        self.published: dict | None = None
        self.threads: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._main, daemon=True, name=f"pod-{self.name}")

    def _grace(self, seconds: Any) -> float:
        return min(float(seconds if seconds is not None else 30), self.runner.max_grace)

    # -- events from the runner

    def update(self, pod: dict) -> None:
        with self.lock:
            self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.stopping.is_set():
            self.grace = self._grace(meta.get("deletionGracePeriodSeconds"))
            self.stopping.set()

    def shutdown(self, grace: float, api: bool) -> None:
        self.api = api and self.api
        if not self.stopping.is_set():
            self.grace = min(self.grace, grace)
            self.stopping.set()

    # -- the pod's thread

    def _main(self) -> None:
        try:
            self._run()
        except Exception:
            self.reason, self.message = "LoopbackKubeletError", traceback.format_exc()[-1500:]
            print(f"[pod-runner] pod {self.ns}/{self.name}: {self.message}", file=sys.stderr)
            self.publish()
        self.stopping.wait()
        self.sidecars_stop.set()
        for t in self.threads:
            t.join()
        self._stop_sandbox()
        if self.api:
            if self.phase not in ("Succeeded", "Failed"):
                failed = any(r.state.get("terminated", {}).get("exitCode") for r in self.mains)
                self.phase = "Failed" if failed else "Succeeded"
            self.publish()
            delete_pod(self.runner.kube, self.pod)
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)
        self.runner.release(self.uid, reuse_ip=self.network_gone)

    def _stop_sandbox(self) -> None:
        """Stops the sandbox and whatever still runs in the pod's network namespace; the
        pod's IP may be reused once those processes have exited and its veth pair is gone."""
        if self.sandbox:
            stop_process(self.sandbox, 0)
            self.sandbox = None
        self.network_gone = self.runner.network.detach(self.uid, self.netns)
        if not self.network_gone:
            print(f"[pod-runner] pod {self.ns}/{self.name}: a process or the veth of its "
                  f"network outlived the stop; its IP {self.ip} stays reserved", file=sys.stderr)
        self.netns = None

    def _run(self) -> None:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        while not self._setup():
            if self.stopping.wait(2):
                return
        for run in self.inits:
            if run.kind == "sidecar":
                self._thread(run, "Always")
                while not run.started and not self.stopping.wait(0.1):
                    pass
            elif self._loop(run, "Never" if self.policy == "Never" else "OnFailure") != 0:
                if not self.stopping.is_set():
                    self.phase = "Failed"
                    self.publish()
                return
            if self.stopping.is_set():
                return
        self.initialized = True
        for run in self.mains:
            self._thread(run, self.policy)
        while not all(r.done for r in self.mains):
            if self.stopping.wait(0.2):
                return
        codes = [r.state["terminated"]["exitCode"] for r in self.mains]
        self.phase = "Succeeded" if not any(codes) else "Failed"
        self.sidecars_stop.set()
        self.publish()

    def _setup(self) -> bool:
        """The pod IP, volumes, sandbox and network; False (the reason published) to retry.
        A pod deleted meanwhile leaves what was made to _main's cleanup."""
        try:
            if not self.ip:
                self.ip = self.runner.allocate_ip(self.pod)
            if self.sandbox is None:
                self.volumes = prepare_volumes(self.runner.kube, self.pod, self.dir,
                                               self.runner.volume_map)
                self.volumes[ETC_HOSTS] = etc_hosts(self.dir, self.ip, pod_hostname(self.pod))
                tmpfs = {v.path: v.tmpfs_bytes for v in self.volumes.values()
                         if v.tmpfs_bytes is not None}
                self.sandbox = start_sandbox(pod_hostname(self.pod), tmpfs,
                                             self.dir / "sandbox.log")
                self.netns = netns_inode(self.sandbox.pid)
                try:
                    self.runner.network.attach(self.uid, self.sandbox.pid, self.ip)
                except PodNetworkError as exc:
                    self._stop_sandbox()   # the next attempt starts from a fresh namespace
                    raise PodSetupError("CreatePodSandboxError", str(exc)) from None
            self.reason = self.message = None
            self.publish()
            return True
        except (PodSetupError, OSError) as exc:   # OSError: an API call (TokenRequest, ...)
            reason = exc.reason if isinstance(exc, PodSetupError) else "ContainerCreating"
            self.reason, self.message = reason, str(exc)
            for run in [*self.inits, *self.mains]:
                run.state = {"waiting": {"reason": reason, "message": str(exc)}}
            self.publish()
            return False

    def _thread(self, run: ContainerRun, policy: str) -> None:
        t = threading.Thread(target=self._loop, args=(run, policy), daemon=True,
                             name=f"pod-{self.name}-{run.name}")
        self.threads.append(t)
        t.start()

    # -- one container: start, watch, restart

    def _ended(self, run: ContainerRun) -> bool:
        return self.stopping.is_set() or (run.kind == "sidecar" and self.sidecars_stop.is_set())

    def _loop(self, run: ContainerRun, policy: str) -> int | None:
        """Runs the container until it must not restart; its last exit code (None: stopped)."""
        base, cap = self.runner.backoff
        setup_failures = 0
        while not self._ended(run):
            try:
                self._start(run)
            except PodSetupError as exc:
                run.state = {"waiting": {"reason": exc.reason, "message": str(exc)}}
                self.publish()
                setup_failures += 1
                if self.stopping.wait(min(base * 2 ** (setup_failures - 1), cap)):
                    return None
                continue
            code = self._watch(run)
            self._terminated(run, code)
            if self._ended(run):
                return None
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                run.done = True
                self.publish()
                return code
            # The kubelet restarts at once the first time, then backs off 10 s, 20 s, ...
            delay = 0 if run.restarts == 0 else min(base * 2 ** (run.restarts - 1), cap)
            run.last_state = {"terminated": run.state["terminated"]}
            if delay:
                run.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    f"back-off {delay:.0f}s restarting failed container={run.name} "
                    f"pod={self.name}_{self.ns}({self.uid})")}}
            self.publish()
            if self.stopping.wait(delay):
                return None
            run.restarts += 1
        return None

    def _start(self, run: ContainerRun) -> None:
        c = run.spec
        image = self.runner.image(c.get("image", ""))
        with self.lock:
            pod = {**self.pod, "status": {**self.pod.get("status", {}), "podIP": self.ip,
                                          "podIPs": [{"ip": self.ip}], "hostIP": HOST_IP,
                                          "hostIPs": [{"ip": HOST_IP}]}}
        node = self.runner.node_objects[pod["spec"]["nodeName"]]
        env = container_env(self.runner.kube, pod, node, c,
                            self.runner.base_env(pod, image))
        argv = [expand(a, env) for a in (c.get("command") or image.entrypoint)
                + c.get("args", [])]
        if not argv:
            raise PodSetupError("CreateContainerError", f'container "{run.name}": no command '
                                "and the image has no entrypoint")
        mounts = mount_script(with_etc_hosts(c), self.volumes)
        log = self.dir / "logs" / f"{run.name}.log"
        run.log_offset = log.stat().st_size if log.exists() else 0
        run.proc = start_container(self.sandbox.pid, argv, env,
                                   c.get("workingDir") or image.working_dir, mounts, log)
        run.env = env
        run.container_id = f"loopback://{run.proc.pid}"
        run.state = {"running": {"startedAt": now()}}
        run.started = "startupProbe" not in c
        run.ready = run.started and "readinessProbe" not in c
        self.publish()

    def _watch(self, run: ContainerRun) -> int:
        """Waits for the process, running its probes; stops it when the pod stops, or when
        its liveness or startup probe fails. Returns the exit code, as a runtime reports it."""
        started = time.monotonic()
        probes = {k: {**PROBE_DEFAULTS, **run.spec[k]} for k in
                  ("startupProbe", "readinessProbe", "livenessProbe") if k in run.spec}
        due = {k: started + p["initialDelaySeconds"] for k, p in probes.items()}
        streak = {k: [0, 0] for k in probes}     # consecutive successes, failures
        while run.proc.poll() is None:
            if self._ended(run):
                if run.kind == "sidecar":   # sidecars stop after the containers
                    while any(r.proc and r.proc.poll() is None for r in self.mains):
                        time.sleep(0.1)
                stop_process(run.proc, self._pre_stop(run))
                break
            kill = self._probe(run, probes, due, streak)
            if kill:
                stop_process(run.proc, self._grace(
                    run.spec.get("terminationGracePeriodSeconds",
                                 self.pod["spec"].get("terminationGracePeriodSeconds", 30))))
                break
            time.sleep(0.1)
        code = run.proc.wait()
        return 128 - code if code < 0 else code

    def _pre_stop(self, run: ContainerRun) -> float:
        """A preStop `sleep` hook (the one hook action run here) within the grace period,
        shared with SIGTERM as on a kubelet (2 s more after an overrun): the seconds left."""
        hook = ((run.spec.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
        slept = min(float(hook.get("seconds", 0)), self.grace)
        deadline = time.monotonic() + slept
        while time.monotonic() < deadline and run.proc.poll() is None:
            time.sleep(0.1)
        return max(self.grace - slept, 2.0)

    def _probe(self, run: ContainerRun, probes: dict, due: dict, streak: dict) -> bool:
        """Runs the probes that are due; True when the container must be killed."""
        for kind, probe in probes.items():
            if (kind == "startupProbe") == run.started or time.monotonic() < due[kind]:
                continue
            ok = run_probe(probe, run.spec, self.ip, run.proc.pid, run.env)
            due[kind] = time.monotonic() + probe["periodSeconds"]
            s = streak[kind]
            s[0], s[1] = (s[0] + 1, 0) if ok else (0, s[1] + 1)
            if kind == "startupProbe" and s[0] >= 1:
                run.started = True
                run.ready = "readinessProbe" not in probes
                self.publish()
            elif kind == "readinessProbe" and run.ready != (s[0] >= probe["successThreshold"]):
                if ok or s[1] >= probe["failureThreshold"]:
                    run.ready = ok
                    self.publish()
            elif kind != "readinessProbe" and s[1] >= probe["failureThreshold"]:
                return True
        return False

    def _terminated(self, run: ContainerRun, code: int) -> None:
        state = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                 "startedAt": run.state.get("running", {}).get("startedAt", now()),
                 "finishedAt": now(), "containerID": run.container_id}
        if code >= 128:
            state["signal"] = code - 128
        if code:   # terminationMessagePolicy FallbackToLogsOnError: the log's tail
            state["message"] = log_tail(self.dir / "logs" / f"{run.name}.log", run.log_offset)
        run.state = {"terminated": state}
        run.started = False
        run.ready = run.kind == "init" and code == 0   # as the kubelet reports a finished init
        self.publish()

    def status(self) -> dict:
        if self.phase == "Pending" and self.initialized and any(
                r.container_id for r in self.mains):
            self.phase = "Running"
        return self.conditions.pod_status(
            self.phase, self.sandbox is not None, self.inits, self.mains, self.ip,
            self.pod.get("status", {}).get("conditions", []), self.start_time, self.reason,
            self.message)

    def publish(self) -> None:
        """Writes the status through pods/status when it changed (a merge patch: the lists
        it writes are whole, as the kubelet's are)."""
        with self.lock:
            status = self.status()
            if status == self.published or not self.api:
                return
            try:
                self.runner.kube.merge_patch(
                    f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", {"status": status})
                self.published = status
            except Exception as exc:
                print(f"[pod-runner] status of {self.ns}/{self.name}: {exc!r}", file=sys.stderr)
