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
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
PYTHON="${PYTHON:-python3}"
case "${1:-test}" in
  test)     REQS="$TOOLS_DIR/requirements-dev.txt"; PREFIX=venv
            WHAT="vLLM 0.33.0, torch and NIXL, about 10 GB, ~5-10 min" ;;
  operator) REQS="$TOOLS_DIR/requirements-operator.txt"; PREFIX=operator
            WHAT="kopf, kubernetes, cel-python, about 200 MB, under a minute" ;;
  *) echo "usage: $0 [test|operator]" >&2; exit 2 ;;
esac
key=$(sha256sum < "$REQS" | cut -c1-16)
VENV="$CACHE_ROOT/$PREFIX-$key"
mkdir -p "$CACHE_ROOT"
# One builder at a time: a second caller waits here instead of deleting a half-built venv.
exec 9>"$VENV.lock"
flock 9
if [[ ! -f "$VENV/.complete" ]]; then
  start=$SECONDS
  echo "[python-env] creating $VENV (first time: $WHAT)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  if [[ $PREFIX == operator ]]; then
    # A complete lock: --no-deps keeps a fresh install from resolving anything.
    "$VENV/bin/pip" install --progress-bar off --no-deps -r "$REQS" >&2
  else
    "$VENV/bin/pip" install --progress-bar off -r "$REQS" >&2
  fi
  touch "$VENV/.complete"
  echo "[python-env] created $VENV in $((SECONDS - start)) s" >&2
fi
# The project itself is installed editable each time (cheap), so the console scripts exist.
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e "$REPO" >&2 2>/dev/null \
  || "$VENV/bin/pip" install --quiet --no-deps -e "$REPO" >&2
flock -u 9
echo "$VENV"
