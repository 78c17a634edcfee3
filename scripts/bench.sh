#!/usr/bin/env bash
# Benchmarks; each prints its figures and ends with one summary line.
#   bench.sh control   control-plane round trip vs bare NATS (CONTROL ...), what NATS
#                      authentication and TLS cost it (SECURITY ...), and what member TLS
#                      costs a round trip on protoactor's remote (REMOTE ...) and a TCP pull's
#                      throughput (TLSDATA ...): both on by default with auth
#   bench.sh pull      data-plane pulls vs memcpy, ucx_perftest, TCP (RATIO ...), and where a small pull's fixed
#                      cost goes against a bare NATS round trip and the NATS floor of a pull's four messages
#                      (BREAKDOWN ..., one per case; BENCH_PULL_LAYOUTS=fixed for those pulls alone; with
#                      BENCH_PULL_API_LAYERS=1 what each layer of the engine API costs, APILAYERS ...); pulls between
#                      engines of other TP sizes, block sizes and orders against the homogeneous pull of the same
#                      bytes (HETERO ...)
#   bench.sh cluster   failover timings (FAILOVER ...)
#   bench.sh resume    what a decode death costs a streamed request, resumed vs re-prefilled (RESUME ...)
#   bench.sh hosts     a TCP pull between two network-namespace hosts vs iperf3 on the same pair (HOSTS ...);
#                      needs root, iproute2, nftables and iperf3
#   bench.sh vllm      the same on real `vllm serve` engines (vllm-cpu, the "small" model): resumed vs
#                      re-prefilled, and each resume's parts against its limit (VLLM ... resume_vs_limit=
#                      after_detection_vs_limit=); BENCH_VLLM_MODEL, BENCH_VLLM_PROMPT, BENCH_TRIALS, BENCH_VLLM_LOGS=dir (each engine's vLLM log); installs
#                      vllm-cpu on first use
#   bench.sh deadline  how long after its context's deadline a Get returns against a silent or stalled
#                      peer, TCP and UCX (DEADLINE ...); the tests only bound it by a 10 s hang guard
#   bench.sh scale     CPU per request over the first and last 10k of 100k requests through the request store
#                      and its orphan scan, and idle CPU before and after (SCALE ...); BENCH_SCALE_REQUESTS=n
#                      for fewer, BENCH_SCALE_IDLE_S=s for the idle windows
#   bench.sh holds     what each live hold costs connexd: BENCH_HOLDS (default 100k) holds created as hold.create
#                      creates them (hold actors, lease timers, registrations in the default data plane), process
#                      RSS and Go heap bytes and goroutines per hold, against a bare lease.Hold (HOLDS ...);
#                      BENCH_HOLDS_BACKEND=tcp|ucx|auto, BENCH_HOLDS_HEAPPROFILE=file for where the bytes are
#   bench.sh router    the Connex router against vllm-router (round_robin, cache_aware) in front of the same instant
#                      P/D engines, interleaved rounds: requests/s at c=1, 8, 32, p99 added over the direct path,
#                      router CPU per request, idle CPU (ROUTER ...); vllm-router (the version engine/vllm-connector/vllm-cpu's
#                      lock pins) goes into its own venv on first use ($VLLM_ROUTER_VENV, default
#                      /var/cache/connex/venv-vllm-router); BENCH_ROUNDS, BENCH_ROUTER_SECONDS, BENCH_ROUTER_IDLE_S,
#                      BENCH_ROUTER_PRESET (local), BENCH_ROUTER_PPROF=file for a CPU profile of the Connex router,
#                      BENCH_ROUTER_PPROF_IDLE=file one of it idle
#   bench.sh load      many requests through make run's cluster (connex-sim at 1 ms a token, c=32): rps, p99 and the
#                      slowest requests with their cluster log lines (LOAD ...); BENCH_REQUESTS (100000),
#                      BENCH_CONCURRENCY (32), BENCH_LOAD_MAX_TOKENS (16), BENCH_LOAD_DECODE_MS (1)
#   bench.sh pace      a decode vLLM's pace through Connex against the same engine alone, interleaved (PACE
#                      engine_itl_vs_alone= client_gap_p99_vs_alone= max_gap_vs_alone=); BENCH_ROUNDS,
#                      BENCH_PACE_TOKENS, BENCH_VLLM_MODEL (default: the tiny model), BENCH_PACE_ISOLATE=1 (decode-0
#                      alone on CPU 1, all else on CPU 0), BENCH_PACE_PROGRESS_EVERY=n (request.progress every n tokens),
#                      BENCH_PACE_THREADS=1 (the engines' CPU by thread), BENCH_PACE_PROFILE=file (the router's Go CPU
#                      profile, BENCH_PACE_PROFILE_S seconds), BENCH_PACE_LOGS=dir (each engine's vLLM log)
#   bench.sh peers     Connex (ConnexConnector behind the Connex router) against vLLM's own P/D stack (NixlConnector
#                      behind vllm-router --vllm-pd-disaggregation) on the same vllm-cpu engines and model: vllm bench
#                      serve at c=1 and c=8, interleaved, then each with a decode vLLM SIGKILLed mid-run (PEERS
#                      ttft_p50_vs_nixl= ttft_p99_vs_nixl= rps_vs_nixl= connex_failed_on_kill= nixl_failed_on_kill=);
#                      its own venv with NIXL (engine/vllm-connector/vllm-cpu/install-nixl.sh, first use: a few
#                      minutes); BENCH_VLLM_MODEL (default: the small model, made on first use), BENCH_PEERS_PROMPTS,
#                      BENCH_PEERS_INPUT_LEN, BENCH_PEERS_OUTPUT_LEN, BENCH_PEERS_WARMUP, BENCH_PEERS_LOGS, BENCH_PEERS_UCX_TLS,
#                      BENCH_PEERS_STOCK_STEPPING=1 (the prefill vLLM steps and spins as stock vLLM, as NIXL's),
#                      BENCH_PEERS_NIXL_PROGRESS_THREAD=0 (NIXL's agents without their UCX progress thread, which polls)
#   bench.sh grammar   what a resume's grammar carry-over costs: connex_vllm.grammar.advance (vLLM's XgrammarGrammar)
#                      over k = 20 and 200 generated tokens, regex / json / grammar, beside the grammar work of
#                      sampling them (GRAMMAR ...); the tiny model's tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
TAGS=()
if pkg-config --exists ucx 2>/dev/null; then TAGS=(-tags ucx); fi
echo "bench: connexd built ${TAGS[*]:-without UCX (no pkg-config ucx): TCP data plane only}"
out=$(mktemp)
shm=""
cleanup() {
  rm -f "$out"
  if [ -n "$shm" ]; then umount "$shm" 2>/dev/null; rmdir "$shm"; fi
}
trap cleanup EXIT
# small_model VENV DIR makes the seeded "small" model in DIR with VENV's
# Python unless DIR holds one already.
small_model() {
  if [ ! -f "$2/config.json" ]; then
    echo "bench: making the small model in $2 (~1 minute)"
    HF_HUB_OFFLINE=1 "$1/bin/python" engine/vllm-connector/vllm-cpu/make_model.py --size small "$2" >/dev/null
  fi
}

case "${1:-control}" in
  control)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkControl(RTT|Security)$' -benchtime "${BENCH_N:-3000}x" ./harness/e2e/ | tee "$out"
    grep '^CONTROL ' "$out" | tail -1
    grep '^SECURITY ' "$out" | tail -1
    go test -run '^$' -bench '^BenchmarkRemoteTLS$' -benchtime "${BENCH_N:-3000}x" ./cluster/ | tee -a "$out"
    go test -run '^$' -bench '^BenchmarkGetTLS$' -benchtime 20x ./transport/tcp/ | tee -a "$out"
    grep '^REMOTE ' "$out" | tail -1
    grep '^TLSDATA ' "$out" | tail -1
    ;;
  pull)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkPull(Hetero)?$' -benchtime 1x -timeout 30m ./harness/e2e/ | tee "$out"
    grep '^BREAKDOWN ' "$out" || true
    grep '^APILAYERS ' "$out" || true
    grep '^RATIO ' "$out" | tail -1
    grep '^HETERO ' "$out" | tail -1
    ;;
  cluster)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -timeout 30m ./harness/e2e/ | tee "$out"
    grep '^FAILOVER ' "$out" | tail -1
    ;;
  resume)
    # KV regions on 2 MiB pages, as in production (docs/configuration.md: shm_dir): as
    # root, a huge=always tmpfs of our own unless BENCH_SHM_DIR names one.
    if [ -z "${BENCH_SHM_DIR:-}" ] && [ "$(id -u)" = 0 ]; then
      shm=$(mktemp -d /tmp/connex-bench-shm.XXXXXX)
      if mount -t tmpfs -o huge=always,size=16g,mode=0700 connex-bench-shm "$shm"; then
        export BENCH_SHM_DIR="$shm"
      else
        rmdir "$shm"; shm=""
      fi
    fi
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkResume$' -benchtime 1x -timeout 30m ./harness/e2e/ | tee "$out"
    grep '^RESUME ' "$out" | tail -1
    ;;
  hosts)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkHosts$' -benchtime 1x -timeout 10m -v ./harness/e2e/ | tee "$out"
    grep '^HOSTS ' "$out" | tail -1 || { echo "bench.sh hosts: no HOSTS line (the benchmark skipped: see its SKIP reason above)" >&2; exit 1; }
    ;;
  deadline)
    pkgs=(./transport/tcp/)
    [ ${#TAGS[@]} -gt 0 ] && pkgs+=(./transport/ucx/)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkGetPastDeadline$' -benchtime "${BENCH_N:-20}x" "${pkgs[@]}" | tee "$out"
    # The reference is the deadline itself: 20 ms against a silent or stalled peer (ratio = lateness / 20 ms);
    # the onesided 256 MiB copy has a 1 ms deadline and is reported alone.
    awk '/^pkg:/ { pkg = $2; sub(/.*\//, "", pkg) }
         /^BenchmarkGetPastDeadline/ { name = $1; sub(/^BenchmarkGetPastDeadline\/?/, "", name); sub(/-[0-9]+$/, "", name); gsub(/[\/-]/, "_", name)
           for (i = 1; i < NF; i++) if ($(i+1) == "ms-past-deadline") { n++; s = s sprintf(" %s%s_ms=%s", pkg, name == "" ? "" : "_" name, $i)
             if (name !~ /onesided/ && $i > worst) worst = $i } }
         END { if (!n) exit 1; printf "DEADLINE%s worst_vs_20ms_deadline=%.3f\n", s, worst / 20 }' "$out"
    ;;
  vllm)
    vllm_out=$(bash engine/vllm-connector/vllm-cpu/install.sh)
    mapfile -t vllm_paths <<<"$vllm_out"
    small="$(dirname "${vllm_paths[1]}")/small"
    small_model "${vllm_paths[0]}" "$small"
    CONNEX_VLLM="${vllm_paths[0]}/bin/vllm" BENCH_VLLM_MODEL="$small" \
      go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkVLLMResume$' -benchtime 1x -timeout 60m ./harness/e2e/ | tee "$out"
    grep '^VLLM ' "$out" | tail -1
    ;;
  pace)
    vllm_out=$(bash engine/vllm-connector/vllm-cpu/install.sh)
    mapfile -t vllm_paths <<<"$vllm_out"
    CONNEX_VLLM="${vllm_paths[0]}/bin/vllm" CONNEX_VLLM_MODEL="${vllm_paths[1]}" \
      go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkVLLMPace$' -benchtime 1x -timeout 30m ./harness/e2e/ | tee "$out"
    grep '^PACE ' "$out" | tail -1
    ;;
  peers)
    vllm_out=$(bash engine/vllm-connector/vllm-cpu/install-nixl.sh)
    mapfile -t vllm_paths <<<"$vllm_out"
    model=${BENCH_VLLM_MODEL:-"$(dirname "${vllm_paths[1]}")/small"}
    small_model "${vllm_paths[0]}" "$model"
    BENCH_PEERS_VENV="${vllm_paths[0]}" BENCH_VLLM_MODEL="$model" \
      go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkVLLMPeers$' -benchtime 1x -timeout 120m ./harness/e2e/ | tee "$out"
    grep '^PEERS ' "$out" | tail -1
    ;;
  grammar)
    vllm_out=$(bash engine/vllm-connector/vllm-cpu/install.sh)
    mapfile -t vllm_paths <<<"$vllm_out"
    HF_HUB_OFFLINE=1 "${vllm_paths[0]}/bin/python" engine/vllm-connector/tests/bench_grammar.py "${vllm_paths[1]}" | tee "$out"
    grep '^GRAMMAR worst' "$out" | tail -1
    ;;
  scale)
    go test -run '^$' -bench '^BenchmarkScale$' -benchtime 1x -timeout 30m ./requests/ | tee "$out"
    grep '^SCALE ' "$out" | tail -1
    ;;
  holds)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkHolds$' -benchtime 1x -timeout 30m ./actors/ | tee "$out"
    grep '^HOLDS ' "$out" | tail -1
    ;;
  router)
    venv=${VLLM_ROUTER_VENV:-/var/cache/connex/venv-vllm-router}
    lock=engine/vllm-connector/vllm-cpu/requirements-lock.txt
    pin=$(grep -E '^vllm-router==' "$lock")
    if [ "$("$venv/bin/python" -m pip freeze 2>/dev/null | grep -E '^vllm-router==')" != "$pin" ]; then
      echo "bench: installing $pin into $venv (its dependencies as $lock pins them)"
      "${PYTHON:-python3}" -m venv "$venv"
      "$venv/bin/python" -m pip install -q -c "$lock" "$pin"
    fi
    CONNEX_VLLM_ROUTER="$venv/bin/vllm-router" \
      go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkRouter$' -benchtime 1x -timeout 30m ./harness/e2e/ | tee "$out"
    grep '^ROUTER ' "$out" | tail -1
    ;;
  load)
    # BENCH_REQUESTS (100000) streamed completions through make run's cluster (connex-sim at
    # BENCH_LOAD_DECODE_MS=1 ms a token) at BENCH_CONCURRENCY (32), and the slowest with its log lines
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkLoad$' -benchtime 1x -timeout 60m ./harness/e2e/ | tee "$out"
    grep '^LOAD ' "$out" | tail -1
    ;;
  *) echo "usage: $0 control|pull|cluster|resume|hosts|deadline|scale|holds|vllm|router|load|grammar|pace|peers" >&2; exit 2 ;;
esac
