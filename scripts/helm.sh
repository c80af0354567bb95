#!/usr/bin/env bash
# Helm 3 for the chart in deploy/helm/hintstream, built from its Go module
# (helm.sh/helm/v3) with the machine's Go, and the chart's checks.
#
#   scripts/helm.sh install    build helm into the cache (once; several minutes cold on 2 cores)
#   scripts/helm.sh path       install, then print the helm binary (last line)
#   scripts/helm.sh check      install, then: helm lint, helm template under each of
#                              deploy/helm/hintstream/ci/*-values.yaml, and the Go test of
#                              deploy/helm/check, which decodes every rendered manifest
#                              strictly against its Go type (k8s.io/api, KEDA, the
#                              Prometheus operator) and checks the chart's rules
#   scripts/helm.sh template VALUES...   install, then print `helm template` of the chart
#
# Everything downloaded or built stays under $HINTSTREAM_CACHE (default
# ${XDG_CACHE_HOME:-~/.cache}/hintstream): helm in helm-$HELM_VERSION/, the Go
# module and build caches in go/. Needs Go 1.26 or newer on PATH (deploy/helm/check/go.mod says go 1.26.0).
set -euo pipefail

HELM_VERSION=v3.22.0
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CHART="$ROOT/deploy/helm/hintstream"
CHECK="$ROOT/deploy/helm/check"
CACHE="${HINTSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hintstream}"
HELM_DIR="$CACHE/helm-$HELM_VERSION"
HELM="$HELM_DIR/helm"
# The Go caches of these builds, kept with the rest of the project's caches.
export GOPATH="$CACHE/go"
export GOMODCACHE="$CACHE/go/pkg/mod"
export GOCACHE="$CACHE/go/build"
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
export CGO_ENABLED=0

say() { echo "helm: $*" >&2; }

# Seconds since T0 (a `date +%s.%N`), to a tenth.
since() { awk -v t0="$1" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}'; }

need_go() {
  command -v go >/dev/null 2>&1 || { say "go is missing: install Go 1.26 or newer (https://go.dev/doc/install; Debian: apt-get install golang)"; exit 1; }
}

install() {
  if [ -x "$HELM" ]; then return 0; fi
  need_go
  mkdir -p "$HELM_DIR"
  exec 9>"$HELM_DIR/.lock"
  flock 9
  if [ -x "$HELM" ]; then exec 9>&-; return 0; fi
  say "building helm $HELM_VERSION from helm.sh/helm/v3 with $(go version | awk '{print $3}') into $HELM_DIR (several minutes the first time)"
  local t0 tmp
  t0=$(date +%s.%N)
  tmp=$(mktemp -d)
  # `go install MODULE@VERSION` builds with the module's own go.mod and
  # go.sum (checked against the checksum database). The version is stamped
  # as helm's release builds stamp it, so that `helm version` names it.
  GOBIN="$tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$tmp/helm" "$HELM"
  rmdir "$tmp"
  exec 9>&-
  say "built $("$HELM" version --short) in $(since "$t0") s"
}

check() {
  install
  need_go
  local t0 out values name
  t0=$(date +%s.%N)
  out=$(mktemp -d)
  trap 'rm -rf "$out"' RETURN
  "$HELM" lint --strict "$CHART"
  for values in "$CHART"/ci/*-values.yaml; do
    name=$(basename "$values" -values.yaml)
    "$HELM" lint --strict "$CHART" --values "$values" >/dev/null
    "$HELM" template hintstream "$CHART" --namespace rl --values "$values" >"$out/$name.yaml"
    say "helm template with ci/$(basename "$values"): $(grep -c '^kind:' "$out/$name.yaml") manifests"
  done
  # The rendered manifests, decoded strictly; the binary, when built, checks
  # each rendered hintstream.toml as the stages would load it.
  local bin="${HINTSTREAM_BIN:-$ROOT/${CARGO_TARGET_DIR:-target}/debug/hintstream}"
  (cd "$CHECK" && RENDERED="$out" CHART="$CHART" REPO="$ROOT" HINTSTREAM_BIN="$bin" HELM="$HELM" \
    go test -count=1 ./...)
  say "chart checked in $(since "$t0") s"
}

case "${1:-}" in
  install) install ;;
  path) install; echo "$HELM" ;;
  check) check ;;
  template)
    shift
    install
    args=()
    for v in "$@"; do args+=(--values "$v"); done
    "$HELM" template hintstream "$CHART" --namespace rl "${args[@]}"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
