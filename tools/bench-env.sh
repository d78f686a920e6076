#!/usr/bin/env bash
# Creates (or reuses) the benchmark environment: inference-perf 0.7.0 (the load generator),
# llmd-benchmark-report 0.2.1 and matplotlib, outside the repository, keyed by the hash of
# tools/requirements-bench.txt. Prints the venv path; logs go to stderr. inference-perf needs
# Python >= 3.12: set BENCH_PYTHON, or have python3.12 on PATH.
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$TOOLS_DIR/venv-lib.sh"
# The first interpreter >= 3.12 among BENCH_PYTHON, those on PATH and pyenv's installs.
find_python() {
  local c
  for c in ${BENCH_PYTHON:-} python3.13 python3.12 python3 \
           $(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.1[2-9]*/bin/python3 2>/dev/null); do
    if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}
REQS="$TOOLS_DIR/requirements-bench.txt"
if ! PYTHON=$(find_python); then
  echo "[bench-env] inference-perf needs Python >= 3.12: install python3.12 or set BENCH_PYTHON" >&2
  exit 1
fi
VENV=$(venv_path bench "$REQS")
ensure_venv bench-env "$VENV" "$PYTHON" "inference-perf, matplotlib; ~1-2 min" --no-deps -r "$REQS"
flock -u 9
echo "$VENV"
