# syntax=docker/dockerfile:1.7
# Two images from one repository:
#   docker build --target engine   -t ghcr.io/longctx/engine:0.1.0 .
#   docker build --target operator -t ghcr.io/longctx/longctx-operator:0.1.0 .
# The operator image carries no vLLM and no torch (pyproject's base dependencies only);
# the engine image is vLLM's own release image plus the pure-Python longctx packages.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---------------------------------------------------------------- wheel (shared build step)
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY engine/ engine/
COPY operator/ operator/
COPY kernels/ kernels/
RUN python -m pip install --no-cache-dir "setuptools>=68" wheel \
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
 && longctx-engine --help >/dev/null
ENV VLLM_NO_USAGE_STATS=1
# The operator sets the container command to
#   longctx-engine run --role prefill|decode --config /etc/longctx/engine.yaml
ENTRYPOINT ["longctx-engine"]
CMD ["run", "--help"]

# ---------------------------------------------------------------- operator
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
COPY --from=wheel /wheels /tmp/wheels
# Installs the base dependencies only (kopf, kubernetes, prometheus-client, pyyaml):
# not the `engine` or `kernels` extras, so neither vLLM nor torch.
RUN python -m pip install --no-cache-dir /tmp/wheels/longctx-*.whl \
 && rm -rf /tmp/wheels \
 && python -c "import sys, longctx_operator.main; assert 'vllm' not in sys.modules and 'torch' not in sys.modules"
USER 65532:65532
# `longctx operator` runs Kopf with the handlers of longctx_operator.main
# (the chart passes: operator [--namespace NS] [--peering NAME] ...).
ENTRYPOINT ["longctx"]
CMD ["operator"]
