#!/usr/bin/env bash
# Runs `make test` with a JUnit report and records what it cost (tests/suite_times.py): the
# total and each module's seconds, and each real-engine test's, in docs/figures/make-test.json,
# from which docs/test-harness.md's table is generated. Run it on a quiet machine.
#
#   tools/measure-make-test.sh ["what was run"]     default: "make test, warm"
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CASE=${1:-make test, warm}
junit=$(mktemp --suffix=.xml)
load=$(cut -d' ' -f1 /proc/loadavg)
PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --junitxml=$junit" make -C "$REPO" --no-print-directory test
rc=$?
PYTHONPATH="$REPO/core:$REPO/operator:$REPO" "$("$REPO/tools/python-env.sh")/bin/python" \
  -m tests.suite_times "$junit" "$CASE" --load "$load"
rm -f "$junit"
exit $rc
