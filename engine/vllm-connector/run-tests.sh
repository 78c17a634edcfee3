#!/usr/bin/env bash
# The connector's checks: a pinned virtual environment (created once, reused), ruff, pytest against real
# connexd processes, on vLLM 0.33 and again on vLLM 0.34. `run-tests.sh --bench` runs the decode-side overhead benchmark instead of the tests.
#
# VENV (default: <repo>/.venv-vllm) is made by install-test-venv.sh and reused when it already holds the
# pinned set; the first install of vllm==0.33.0 takes ~12 minutes and ~9.4 GB (pip's download cache is kept).
# CONNEXD (default: <repo>/bin/connexd, built here with `go build`) is the connexd binary the tests start.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${VENV:-$root/.venv-vllm}
py=${PYTHON:-python3}

VENV="$venv" PYTHON="$py" bash "$here/install-test-venv.sh" >/dev/null

if [[ -z "${CONNEXD:-}" ]]; then
  (cd "$root" && go build -o bin/connexd ./cmd/connexd)
  export CONNEXD="$root/bin/connexd"
fi
export HF_HUB_OFFLINE=1

cd "$here"
if [[ "${1:-}" == "--bench" ]]; then
  shift
  exec "$venv/bin/python" tests/bench_decode.py "$@"
fi
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
# The same tests on vLLM 0.34 (install-test-venv-034.sh derives its environment from the 0.33 one), unless
# CONNEX_VLLM034=0.
if [[ "${CONNEX_VLLM034:-1}" != 0 ]]; then
  venv034=$(VENV="$venv" bash "$here/install-test-venv-034.sh")
  echo "connector: the same tests on $("$venv034/bin/python" -c 'import vllm; print("vLLM", vllm.__version__)')"
  "$venv034/bin/python" -m pytest -q -p no:cacheprovider "$@"
fi
