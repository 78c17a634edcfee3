#!/usr/bin/env bash
# Benchmarks; each prints its figures and ends with one summary line.
#   bench.sh control   control-plane round trip vs bare NATS (CONTROL ...)
#   bench.sh pull      data-plane pulls vs memcpy, ucx_perftest, TCP (RATIO ...)
#   bench.sh cluster   failover timings (FAILOVER ...)
#   bench.sh resume    what a decode death costs a streamed request, resumed vs re-prefilled (RESUME ...)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
TAGS=()
if pkg-config --exists ucx 2>/dev/null; then TAGS=(-tags ucx); fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
case "${1:-control}" in
  control)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkControlRTT$' -benchtime "${BENCH_N:-3000}x" ./e2e/ | tee "$out"
    grep '^CONTROL ' "$out" | tail -1
    ;;
  pull)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkPull$' -benchtime 1x -timeout 30m ./e2e/ | tee "$out"
    grep '^RATIO ' "$out" | tail -1
    ;;
  cluster)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -timeout 30m ./e2e/ | tee "$out"
    grep '^FAILOVER ' "$out" | tail -1
    ;;
  resume)
    go test "${TAGS[@]}" -run '^$' -bench '^BenchmarkResume$' -benchtime 1x -timeout 30m ./e2e/ | tee "$out"
    grep '^RESUME ' "$out" | tail -1
    ;;
  *) echo "usage: $0 control|pull|cluster|resume" >&2; exit 2 ;;
esac
