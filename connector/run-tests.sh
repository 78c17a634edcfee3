#!/usr/bin/env bash
# The connector's checks: a pinned virtual environment (created once, reused), ruff, pytest against real
# connexd processes. `run-tests.sh --bench` runs the decode-side overhead benchmark instead of the tests.
#
# VENV (default: <repo>/.venv-vllm) is reused when it already holds the pinned set; the first install of
# vllm==0.33.0 takes ~12 minutes and ~9.4 GB (pip's download cache is kept, so later installs are fast).
# CONNEXD (default: <repo>/bin/connexd, built here with `go build`) is the connexd binary the tests start.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
venv=${VENV:-$root/.venv-vllm}
py=${PYTHON:-python3}

stamp="$venv/.connex-requirements"
want=$(cat "$here/requirements-test.txt" "$here/requirements-lock.txt" | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "connector: installing pinned Python dependencies into $venv (first time: ~12 minutes)" >&2
  [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements-test.txt" -c "$here/requirements-lock.txt"
  echo "$want" >"$stamp"
fi
"$venv/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$here"

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
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
