# Sourced by tools/python-env.sh, tools/engine-env.sh and tools/bench-env.sh: a Python
# environment in the cache outside the repository, keyed by the hash of its requirements
# file, built once. Logs go to stderr.
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"

# venv_path PREFIX REQUIREMENTS: the environment's folder for that requirements file.
venv_path() {
  echo "$CACHE_ROOT/$1-$(sha256sum < "$2" | cut -c1-16)"
}

# ensure_venv TAG VENV PYTHON WHAT PIP_INSTALL_ARGS...: creates VENV with PYTHON and
# `pip install PIP_INSTALL_ARGS` unless it is complete. It holds VENV's lock (fd 9) until the
# caller runs `flock -u 9`: a second caller waits instead of deleting a half-built venv.
ensure_venv() {
  local tag=$1 venv=$2 python=$3 what=$4 start=$SECONDS
  shift 4
  mkdir -p "$CACHE_ROOT"
  exec 9>"$venv.lock"
  flock 9
  [[ -f "$venv/.complete" ]] && return 0
  echo "[$tag] creating $venv (first time: $what)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --progress-bar off "$@" >&2
  touch "$venv/.complete"
  echo "[$tag] created $venv in $((SECONDS - start)) s" >&2
}

# install_project VENV REPO: the project itself, editable (cheap, so done each time): its
# console scripts exist.
install_project() {
  "$1/bin/pip" install --quiet --no-deps --no-build-isolation -e "$2" >&2 2>/dev/null \
    || "$1/bin/pip" install --quiet --no-deps -e "$2" >&2
}
