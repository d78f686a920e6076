#!/usr/bin/env bash
# Runs `make test` with a JUnit report and records what it cost (tests/suite_times.py): the
# total and each module's seconds, and each real-engine test's, beside the run's other figures
# (build/figures/<run>/), then `make figures` puts that run into docs/figures and the tables
# (docs/test-harness.md's among them). Exits non-zero when make test failed or missed its
# budget. Run it on a quiet machine.
#
#   tools/measure-make-test.sh ["what was run"]     default: "make test, warm"
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CASE=${1:-make test, warm}
PY="$("$REPO/tools/python-env.sh")/bin/python"
export PYTHONPATH="$REPO/core:$REPO/operator:$REPO"
# A run of its own, unless the caller names one (to record several cases side by side).
LONGCTX_FIGURES_RUN=${LONGCTX_FIGURES_RUN:-$("$PY" -m tests.figures --new-run)} || exit 1
export LONGCTX_FIGURES_RUN
junit=$(mktemp --suffix=.xml)
load=$(cut -d' ' -f1 /proc/loadavg)
PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --junitxml=$junit" make -C "$REPO" --no-print-directory test
rc=$?
"$PY" -m tests.suite_times "$junit" "$CASE" --load "$load" || { [[ $rc == 0 ]] && rc=1; }
rm -f "$junit"
make -C "$REPO" --no-print-directory figures RUN="$LONGCTX_FIGURES_RUN"
exit $rc
