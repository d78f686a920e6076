#!/usr/bin/env bash
# Builds the llm-d endpoint picker (github.com/llm-d/llm-d-router/cmd/epp) from the Go
# module proxy into the longctx cache, keyed by version; does nothing when it is there.
#
#   tools/build-epp.sh             build if missing, print the binary's path
#   tools/build-epp.sh --check     only say whether the module can be fetched (exit 0/3)
#   tools/build-epp.sh --upstream  build the upstream Gateway API Inference Extension EPP
#                                  (sigs.k8s.io/gateway-api-inference-extension cmd/epp, the
#                                  code llm-d-router's picker derives from; wrapper module
#                                  tools/epp/gie) into bin-gie-epp-<version>/epp, print its path
#
# Environment: LONGCTX_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/longctx).
# Exit status 3: the module cannot be fetched from the configured GOPROXY (the message
# says what the proxy answered); tests then fall back to validating the config statically.
set -euo pipefail

EPP_MODULE=github.com/llm-d/llm-d-router
EPP_VERSION=0.10.0
GIE_MODULE=sigs.k8s.io/gateway-api-inference-extension
GIE_VERSION=1.5.0   # the version tools/build-control-plane.sh takes the InferencePool CRD from
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
BIN="$CACHE_ROOT/bin-epp-$EPP_VERSION"
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

log() { printf '[epp] %s\n' "$*" >&2; }

fetch() {
  local out
  if ! out=$(go mod download -json "$EPP_MODULE@v$EPP_VERSION" 2>&1); then
    local why
    why=$(printf '%s' "$out" | python3 -c 'import json,sys
try: print(json.load(sys.stdin).get("Error","unknown error"))
except Exception: print(sys.stdin.read())' 2>/dev/null || printf '%s' "$out")
    log "cannot fetch $EPP_MODULE@v$EPP_VERSION from GOPROXY=$(go env GOPROXY): $why"
    return 3
  fi
}

build_epp() { # module, version, bin dir; run inside the wrapper module's directory
  local module=$1 version=$2 bin=$3 start=$SECONDS
  mkdir -p "$bin"
  log "building $module/cmd/epp v$version (minutes on 2 cores when the module cache is cold)"
  go build -ldflags "-s -w" -o "$bin/epp.tmp" "$module/cmd/epp"
  mv -f "$bin/epp.tmp" "$bin/epp"
  log "built $bin/epp in $((SECONDS - start)) s"
  echo "$bin/epp"
}

build_upstream() {
  local bin="$CACHE_ROOT/bin-gie-epp-$GIE_VERSION"
  if [[ -x "$bin/epp" ]]; then echo "$bin/epp"; return 0; fi
  cd "$TOOLS_DIR/epp/gie"
  build_epp "$GIE_MODULE" "$GIE_VERSION" "$bin"
}

main() {
  if [[ "${1:-}" == "--check" ]]; then fetch; exit $?; fi
  # One builder at a time: a second caller waits here instead of compiling the same packages.
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/epp-build.lock"
  flock 9
  if [[ "${1:-}" == "--upstream" ]]; then build_upstream; return; fi
  if [[ -x "$BIN/epp" ]]; then echo "$BIN/epp"; return 0; fi
  fetch || exit 3
  cd "$TOOLS_DIR/epp"
  if [[ ! -s go.sum ]]; then
    log "resolving the module graph of $EPP_MODULE v$EPP_VERSION (go mod tidy)"
    go mod tidy
  fi
  build_epp "$EPP_MODULE" "$EPP_VERSION" "$BIN"
}

main "$@"
