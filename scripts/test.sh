#!/usr/bin/env bash
# The test command (README.md, .ci/run): vet, a cgo-free build, race-checked
# unit tests, the full suite (real NATS, real connexd processes, UCX where
# libucx is installed), and a short fuzzing pass over every wire decoder.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"

TAGS=()
if pkg-config --exists ucx 2>/dev/null; then
  TAGS=(-tags ucx)
  echo "== libucx found: building and testing the UCX data plane"
else
  echo "== libucx not found: UCX tests skipped, TCP data plane only"
fi
# A run count, not a duration: time-limited fuzzing can stall on 2 cores
# (go.dev/issue/75804).
FUZZTIME="${FUZZTIME:-5000x}"

# The real NATS CLI, for the test that `nats micro ls` lists connex.
export PATH="$PATH:$(go env GOPATH)/bin"
if ! command -v nats >/dev/null; then
  echo "== installing natscli (nats) from the Go module proxy"
  GOFLAGS= go install github.com/nats-io/natscli/nats@v0.5.0 || echo "natscli install failed; its test will be skipped"
fi

echo "== go.mod is tidy"
go mod tidy -diff

echo "== go vet"
go vet "${TAGS[@]}" ./...
echo "== build without cgo (only transport/ucx may need it)"
CGO_ENABLED=0 go build ./...

# Packages that start no protoactor actor system run under the race
# detector (protoactor-go's own code trips it; see ARCHITECTURE.md).
RACE_PKGS=(./lease/ ./kvmem/ ./config/ ./api/ ./bus/ ./requests/ ./actors/ ./transport/...)
echo "== race detector: ${RACE_PKGS[*]}"
go test "${TAGS[@]}" -race -count=1 "${RACE_PKGS[@]}"

echo "== full suite"
# -p 1: the end-to-end and cluster tests start several processes and time
# failure detection; on 2 cores they must not compete with each other.
go test "${TAGS[@]}" -count=1 -p 1 -timeout 20m ./...

echo "== fuzzing every decoder for ${FUZZTIME}"
for pkg in $(go list "${TAGS[@]}" ./...); do
  for f in $(go test "${TAGS[@]}" -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    go test "${TAGS[@]}" -run '^$' -fuzz "^${f}\$" -fuzztime "$FUZZTIME" "$pkg" | tail -1
  done
done
echo "== all tests passed"
