#!/usr/bin/env bash
# Installs the connector's pinned test environment (vllm==0.33.0 and the test tools, exactly as
# requirements-test.txt and requirements-lock.txt pin them) into $VENV (default: <repo>/.venv-vllm).
# Idempotent: a venv stamped with the same pins is kept, so later runs take a second. The first install
# brings the CUDA build of torch and the nvidia-* wheels: ~9.4 GB and ~12 minutes on a new machine (pip's
# download cache is kept, so a reinstall after a pin change is far faster). Prints the venv's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${VENV:-$root/.venv-vllm}
py=${PYTHON:-python3}

t0=$SECONDS
stamp="$venv/.connex-requirements"
want=$(cat "$here/requirements-test.txt" "$here/requirements-lock.txt" | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "connector: installing pinned Python dependencies into $venv (first time: ~12 minutes, ~9.4 GB)" >&2
  mkdir -p "$(dirname "$venv")"
  [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
  "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements-test.txt" -c "$here/requirements-lock.txt"
  echo "$want" >"$stamp"
  echo "connector: installed in $((SECONDS - t0)) s" >&2
fi
"$venv/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$here" >&2
echo "$venv"
