#!/usr/bin/env bash
# Builds prometheus and promtool from the Go module github.com/prometheus/prometheus
# into a cache outside the repository, keyed by version; does nothing when they are there.
# The tests use promtool to check and unit-test the alert rules and a loopback
# prometheus to run every dashboard query (tests/observability/).
#
#   tools/build-prometheus.sh    build what is missing, print the bin dir
#
# Environment: LONGCTX_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/longctx).
set -euo pipefail

PROMETHEUS_MODULE=github.com/prometheus/prometheus
PROMETHEUS_MODULE_VERSION=0.316.0   # the module version of Prometheus 3.16.0
PROMETHEUS_VERSION=3.16.0
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
BIN="$CACHE_ROOT/bin-prometheus$PROMETHEUS_VERSION"
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

log() { printf '[prometheus] %s\n' "$*" >&2; }

# grep reads the whole output: with pipefail, grep -q's early exit can kill the binary
# with SIGPIPE and fail the check, which then rebuilds.
version_ok() { # binary
  [[ -x "$1" ]] && "$1" --version 2>/dev/null | grep -- "version $PROMETHEUS_VERSION" >/dev/null
}

build() {
  local start=$SECONDS v=github.com/prometheus/common/version
  log "building prometheus and promtool v$PROMETHEUS_VERSION (cold builds take minutes on 2 cores)"
  # Without the builtinassets tag the web UI is not embedded; the HTTP API is all we use.
  GOBIN="$BIN" go install -ldflags "-s -w -X $v.Version=$PROMETHEUS_VERSION -X $v.Branch=HEAD \
    -X $v.Revision=v$PROMETHEUS_MODULE_VERSION -X $v.BuildUser=longctx -X $v.BuildDate=20260101-00:00:00" \
    "$PROMETHEUS_MODULE/cmd/prometheus@v$PROMETHEUS_MODULE_VERSION" \
    "$PROMETHEUS_MODULE/cmd/promtool@v$PROMETHEUS_MODULE_VERSION"
  log "built prometheus and promtool v$PROMETHEUS_VERSION in $((SECONDS - start)) s"
}

main() {
  mkdir -p "$BIN"
  # One builder at a time: a second caller waits here instead of compiling the same packages.
  exec 9>"$BIN.lock"
  flock 9
  { version_ok "$BIN/prometheus" && version_ok "$BIN/promtool"; } || build
  for b in prometheus promtool; do
    version_ok "$BIN/$b" || { log "ERROR: $BIN/$b was not built or reports another version"; exit 1; }
  done
  echo "$BIN"
}

main "$@"
