#!/usr/bin/env bash
# Times a first run as a new user meets it: `make TARGET...` in a fresh export of the committed
# tree, with empty caches of its own under DIR (LONGCTX_CACHE, GOCACHE, GOMODCACHE; pip's cache
# off), so the caches already on the machine are neither used nor touched. Every output line
# gets the time of day; the build scripts log how long each step took. The README's table of
# first-run costs comes from this script.
#
#   tools/measure-first-run.sh [TARGET...]    default: demo
#
# DIR is $LONGCTX_FIRST_RUN_DIR, default /tmp/longctx-first-run. It takes about 13 GB for the
# demo (the engine environment and the Go caches), is kept for inspection and emptied by the
# next run.
set -uo pipefail
TARGETS=("${@:-demo}")
DIR=${LONGCTX_FIRST_RUN_DIR:-/tmp/longctx-first-run}
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -e "$DIR" && ! -f "$DIR/.longctx-first-run" ]]; then
  echo "$DIR exists and was not made by this script: set LONGCTX_FIRST_RUN_DIR to another folder" >&2
  exit 2
fi
[[ -e "$DIR" ]] && chmod -R u+w "$DIR"   # Go leaves its module cache read-only
rm -rf "$DIR"
mkdir -p "$DIR/tree" "$DIR/cache"
touch "$DIR/.longctx-first-run"
git -C "$REPO" archive HEAD | tar -x -C "$DIR/tree"
export LONGCTX_CACHE="$DIR/cache" GOCACHE="$DIR/cache/go-build" GOMODCACHE="$DIR/cache/go-mod"
export PIP_NO_CACHE_DIR=1
echo "first run of make ${TARGETS[*]}: commit $(git -C "$REPO" rev-parse --short HEAD), $(nproc) cores"
start=$SECONDS
make -C "$DIR/tree" --no-print-directory "${TARGETS[@]}" 2>&1 \
  | while IFS= read -r line; do printf '%s %s\n' "$(date -u +%T)" "$line"; done
rc=${PIPESTATUS[0]}
echo "make ${TARGETS[*]} exited $rc after $((SECONDS - start)) s"
du -sh "$DIR"/cache/* 2>/dev/null
exit "$rc"
