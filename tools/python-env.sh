#!/usr/bin/env bash
# Creates (or reuses) a Python environment outside the repository, keyed by the hash of its
# requirements file, and prints its path; logs go to stderr.
#
#   tools/python-env.sh            the test environment (tools/requirements-dev.txt: the
#                                  operator's packages, pytest, vLLM 0.33.0 on CPU with torch,
#                                  NIXL; about 10 GB): make test, make unit
#   tools/python-env.sh operator   the operator's environment (tools/requirements-operator.txt:
#                                  kopf, kubernetes, cel-python; no vLLM, no torch; about
#                                  200 MB): make demo, plan, render, crds
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$TOOLS_DIR")"
source "$TOOLS_DIR/venv-lib.sh"
PYTHON="${PYTHON:-python3}"
case "${1:-test}" in
  test)     REQS="$TOOLS_DIR/requirements-dev.txt"; PREFIX=venv; DEPS=()
            WHAT="vLLM 0.33.0, torch and NIXL, about 10 GB, ~5-10 min" ;;
  # A complete lock: --no-deps keeps a fresh install from resolving anything.
  operator) REQS="$TOOLS_DIR/requirements-operator.txt"; PREFIX=operator; DEPS=(--no-deps)
            WHAT="kopf, kubernetes, cel-python, about 200 MB, under a minute" ;;
  *) echo "usage: $0 [test|operator]" >&2; exit 2 ;;
esac
VENV=$(venv_path "$PREFIX" "$REQS")
ensure_venv python-env "$VENV" "$PYTHON" "$WHAT" "${DEPS[@]}" -r "$REQS"
install_project "$VENV" "$REPO"
flock -u 9
echo "$VENV"
