#!/usr/bin/env bash
# Creates (or reuses) the Python environment for tests and the demo, outside the
# repository, keyed by the hash of tools/requirements-dev.txt. Prints the venv path.
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$TOOLS_DIR")"
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
PYTHON="${PYTHON:-python3}"
key=$(cat "$TOOLS_DIR/requirements-dev.txt" | sha256sum | cut -c1-16)
VENV="$CACHE_ROOT/venv-$key"
mkdir -p "$CACHE_ROOT"
# One builder at a time: a second caller waits here instead of deleting a half-built venv.
exec 9>"$VENV.lock"
flock 9
if [[ ! -f "$VENV/.complete" ]]; then
  echo "[python-env] creating $VENV (first time: downloads vLLM 0.33.0 and torch, several GB, ~5-10 min)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  "$VENV/bin/pip" install --progress-bar off -r "$TOOLS_DIR/requirements-dev.txt" >&2
  touch "$VENV/.complete"
fi
# The project itself is installed editable each time (cheap), so the console scripts exist.
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e "$REPO" >&2 2>/dev/null \
  || "$VENV/bin/pip" install --quiet --no-deps -e "$REPO" >&2
flock -u 9
echo "$VENV"
