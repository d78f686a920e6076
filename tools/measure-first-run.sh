#!/usr/bin/env bash
# Times a first run as a new user meets it: `make TARGET...` in a fresh export of the committed
# tree, with empty caches of its own under DIR (LONGCTX_CACHE, GOCACHE, GOMODCACHE; pip's cache
# off), so the caches already on the machine are neither used nor touched. Every output line
# gets the time of day; the build scripts log how long each step took, and those times and the
# total are recorded beside the tree, in build/figures/<run>/first-run.json (the run
# $LONGCTX_FIGURES_RUN names, else a new one; name one run for several targets, since
# `make figures RUN=...` replaces docs/figures/first-run.json with the run's whole), from which
# docs/control-plane.md's table is generated. A first `make demo` over its
# 20-minute budget on 2 cores exits 3, naming it.
#
#   tools/measure-first-run.sh [TARGET...]    default: demo
#
# DIR is $LONGCTX_FIRST_RUN_DIR, default /tmp/longctx-first-run. It takes about 13 GB for the
# demo (the engine environment and the Go caches), is kept for inspection and emptied by the
# next run, except its caches with LONGCTX_FIRST_RUN_KEEP_CACHE=1: then the run measures what
# TARGET adds to the previous one (e.g. `make test`'s builds after `make demo`).
set -uo pipefail
TARGETS=("${@:-demo}")
DIR=${LONGCTX_FIRST_RUN_DIR:-/tmp/longctx-first-run}
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -e "$DIR" && ! -f "$DIR/.longctx-first-run" ]]; then
  echo "$DIR exists and was not made by this script: set LONGCTX_FIRST_RUN_DIR to another folder" >&2
  exit 2
fi
[[ -e "$DIR" ]] && chmod -R u+w "$DIR"   # Go leaves its module cache read-only
if [[ ${LONGCTX_FIRST_RUN_KEEP_CACHE:-0} == 1 ]]; then rm -rf "$DIR/tree"; else rm -rf "$DIR"; fi
mkdir -p "$DIR/tree" "$DIR/cache"
touch "$DIR/.longctx-first-run"
git -C "$REPO" archive HEAD | tar -x -C "$DIR/tree"
export LONGCTX_CACHE="$DIR/cache" GOCACHE="$DIR/cache/go-build" GOMODCACHE="$DIR/cache/go-mod"
export PIP_NO_CACHE_DIR=1
commit=$(git -C "$REPO" rev-parse HEAD)
load=$(cut -d' ' -f1 /proc/loadavg)
echo "first run of make ${TARGETS[*]}: commit ${commit:0:10}, $(nproc) cores, load average $load"
start=$SECONDS
# `times` in the subshell: the CPU time of make and everything it ran, which a busy machine
# leaves about as it is (the wall-clock time it stretches).
( make -C "$DIR/tree" --no-print-directory "${TARGETS[@]}"; rc=$?; times > "$DIR/make.times"
  exit $rc ) 2>&1 \
  | while IFS= read -r line; do printf '%s %s\n' "$(date -u +%T)" "$line"; done \
  | tee "$DIR/make.log"
rc=${PIPESTATUS[0]}
total=$((SECONDS - start))
cpu=$(tail -1 "$DIR/make.times" | python3 -c 'import re, sys
print(round(sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", sys.stdin.read()))))')
echo "make ${TARGETS[*]} exited $rc after $total s, $cpu CPU-seconds"
du -sh "$DIR"/cache/* 2>/dev/null
[[ $rc == 0 ]] || exit "$rc"
# Each step's own log line ("created ... in N s", "built ... in N s", "demo finished in N s").
run=${LONGCTX_FIGURES_RUN:-$REPO/build/figures/$(date -u +%Y%m%dT%H%M%S.%6NZ)-${commit:0:10}-first-run}
mkdir -p "$run"
python3 - "$run/first-run.json" "$DIR/make.log" "${TARGETS[*]}" "$commit" \
  "$(nproc)" "$load" "$total" "$cpu" "${LONGCTX_FIRST_RUN_KEEP_CACHE:-0}" <<'PY'
import datetime, json, re, sys
from pathlib import Path
out, log, targets, commit, cores, load, total, cpu, keep = sys.argv[1:]
names = {"operator": "operator environment", "venv": "test environment",
         "engine-cpu": "engine environment", "bench": "benchmark environment"}
steps = {}
for line in Path(log).read_text().splitlines():
    if m := re.search(r"\[(?:python|engine|bench)-env\] created \S*/([a-z-]+)-[0-9a-f]+ in (\d+) s", line):
        steps[names[m[1]]] = int(m[2])
    elif m := re.search(r"\[(?:control-plane|prometheus|epp)\] built (.+?) in (\d+) s", line):
        steps["endpoint picker" if m[1].startswith("/") else m[1]] = int(m[2])
    elif m := re.search(r"demo finished in (\d+) s", line):
        steps["the demo itself"] = int(m[1])
path = Path(out)
record = json.loads(path.read_text()) if path.exists() else {}
after = " after the previous run" if keep == "1" else ""
record[f"make {targets}{after}"] = {
    "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    "commit": commit, "dirty": False,   # `git archive HEAD`: the commit, exactly
    "cores": int(cores), "load average at start": float(load),
    "steps (s)": steps, "total (s)": int(total), "CPU (s)": int(cpu)}
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps(record, indent=1) + "\n")
print(f"recorded in {path}: {json.dumps(record[f'make {targets}{after}'])}")
print(f"make figures RUN={path.parent} puts it into docs/")
PY
if [[ "${TARGETS[*]}" == demo && $(nproc) -le 2 && $total -gt 1200 ]]; then
  echo "a first make demo took $total s on $(nproc) cores: over its 1200 s budget" >&2
  exit 3
fi
