#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) and helm from Go modules into a cache
# outside the repository, keyed by version. Only what is missing is built.
#
#   tools/build-control-plane.sh                 build what is missing, print the bin dir
#   tools/build-control-plane.sh --without-helm  the control plane alone (what `make demo`
#                                                runs; helm is for the chart tests and crds)
#   tools/build-control-plane.sh --regen         regenerate the wrapper go.mod files first
#
# Environment: LONGCTX_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/longctx).
set -euo pipefail

K8S_VERSION=1.37.2
ETCD_VERSION=3.7.0        # what k8s.io/kubernetes v1.37.2 requires
KWOK_VERSION=0.8.0
HELM_VERSION=3.22.0
GATEWAY_API_VERSION=1.6.3
INFERENCE_EXT_VERSION=1.5.0

K8S_MINOR=${K8S_VERSION#1.}; K8S_MINOR=${K8S_MINOR%%.*}
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LONGCTX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx}"
BIN="$CACHE_ROOT/bin-k8s${K8S_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}-helm${HELM_VERSION}"
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false"

log() { printf '[control-plane] %s\n' "$*" >&2; }

regen_k8s_wrapper() {
  log "generating tools/k8s/go.mod for k8s.io/kubernetes v$K8S_VERSION"
  cd "$TOOLS_DIR/k8s"
  rm -f go.mod go.sum
  go mod init longctx.dev/tools/k8s >/dev/null 2>&1
  go mod edit -go=1.26.0
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  # One replace per staging module, read from that exact version's go.mod.
  for m in $(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod"); do
    go mod edit -replace="$m=$m@v0.${K8S_VERSION#1.}"
  done
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION"
  go mod tidy
}

regen_etcd_wrapper() {
  log "generating tools/etcd/go.mod for go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
  cd "$TOOLS_DIR/etcd"
  rm -f go.mod go.sum
  go mod init longctx.dev/tools/etcd >/dev/null 2>&1
  go mod edit -go=1.26.0
  go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  go mod tidy
}

# grep reads the whole output: with pipefail, grep -q's early exit can kill the binary
# with SIGPIPE and fail the check, which then rebuilds.
version_ok() { # binary, expected substring, [version command]
  [[ -x "$1" ]] && "$1" ${3:---version} 2>/dev/null | grep -- "$2" >/dev/null
}

timed() { # label, command...
  local label=$1 start=$SECONDS; shift
  log "building $label (cold builds take minutes on 2 cores; output follows when done)"
  "$@"
  log "built $label in $((SECONDS - start)) s"
}

build_k8s() {
  local ldf="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    ldf+=" -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.buildDate=2026-01-01T00:00:00Z"
  done
  cd "$TOOLS_DIR/k8s"
  go build -ldflags "$ldf" -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl
}

build_etcd() {
  cd "$TOOLS_DIR/etcd"
  go build -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
}

build_kwok() {
  GOBIN="$BIN" go install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
}

build_helm() {
  GOBIN="$BIN" go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$K8S_MINOR" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
}

# Stage files for kwok and the CRDs the tests install (InferencePool, Gateway
# API) come from the module cache: fetched, never committed.
fetch_module_files() {
  local dest="$BIN/../share-k8s${K8S_VERSION}"
  mkdir -p "$dest/kwok-stages" "$dest/crds"
  local kwok_dir gw_dir gie_dir
  kwok_dir=$(go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cp -f "$kwok_dir/kustomize/stage/$f" "$dest/kwok-stages/$(basename "$f")"
  done
  if gw_dir=$(go mod download -json "sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION" 2>/dev/null | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])'); then
    cp -f "$gw_dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$dest/crds/" 2>/dev/null || true
  else
    log "WARNING: sigs.k8s.io/gateway-api@v$GATEWAY_API_VERSION could not be downloaded"
  fi
  if gie_dir=$(go mod download -json "sigs.k8s.io/gateway-api-inference-extension@v$INFERENCE_EXT_VERSION" 2>/dev/null | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])'); then
    cp -f "$gie_dir"/config/crd/bases/inference.networking.k8s.io_*.yaml "$dest/crds/" 2>/dev/null || true
  else
    log "WARNING: sigs.k8s.io/gateway-api-inference-extension@v$INFERENCE_EXT_VERSION could not be downloaded"
  fi
  chmod -R u+w "$dest"
}

main() {
  local binaries="etcd kwok kube-apiserver kube-controller-manager kube-scheduler kubectl"
  local helm=yes
  case "${1:-}" in
    --regen) regen_k8s_wrapper; regen_etcd_wrapper ;;
    --without-helm) helm=no ;;
  esac
  mkdir -p "$BIN"
  # One builder at a time: a second caller waits here instead of compiling the same packages.
  exec 9>"$BIN.lock"
  flock 9
  local t0=$SECONDS
  version_ok "$BIN/etcd" "etcd Version: $ETCD_VERSION" || timed "etcd v$ETCD_VERSION" build_etcd
  version_ok "$BIN/kwok" "$KWOK_VERSION" || timed "kwok v$KWOK_VERSION" build_kwok
  if [[ $helm == yes ]]; then
    binaries+=" helm"
    version_ok "$BIN/helm" "v$HELM_VERSION" "version --short" || timed "helm v$HELM_VERSION" build_helm
  fi
  if ! { version_ok "$BIN/kube-apiserver" "Kubernetes v$K8S_VERSION" \
         && version_ok "$BIN/kube-controller-manager" "Kubernetes v$K8S_VERSION" \
         && version_ok "$BIN/kube-scheduler" "Kubernetes v$K8S_VERSION" \
         && [[ -x "$BIN/kubectl" ]]; }; then
    timed "kube-apiserver, kube-controller-manager, kube-scheduler, kubectl v$K8S_VERSION" build_k8s
  fi
  [[ -f "$BIN/../share-k8s${K8S_VERSION}/kwok-stages/pod-ready.yaml" ]] || fetch_module_files
  for b in $binaries; do
    [[ -x "$BIN/$b" ]] || { log "ERROR: $BIN/$b was not built"; exit 1; }
  done
  log "control plane binaries ready in $BIN ($((SECONDS - t0)) s)"
  echo "$BIN"
}

main "$@"
