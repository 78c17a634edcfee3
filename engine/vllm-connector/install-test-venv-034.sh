#!/usr/bin/env bash
# Derives the connector's vLLM 0.34 test environment from its 0.33 one (install-test-venv.sh): a copy of that
# venv with vllm==0.34.0 installed over it without dependencies. vLLM 0.34.0 pins flashinfer-python==0.7.3,
# which the package index does not serve, so a resolved install fails; every other pin of 0.34 is what the
# 0.33 lock already holds (torch 2.14.0 among them), and flashinfer stays at 0.7.2.post1 (a CUDA kernel library:
# unused on CPU). Idempotent: a venv stamped with the same pins is kept. ~9.4 GB copied, ~1-2 minutes; the
# 0.34 wheel (~230 MB) comes from pip's cache after the first download. Prints the venv's path.
#
#   VENV (the 0.33 venv, default <repo>/.venv-vllm)   VENV034 (default: "$VENV"034)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
base=$(VENV="${VENV:-$root/.venv-vllm}" bash "$here/install-test-venv.sh")
venv=${VENV034:-${base}034}
pin="vllm==0.34.0"

t0=$SECONDS
stamp="$venv/.connex-requirements"
want=$( (cat "$base/.connex-requirements"; echo "$pin") | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "connector: deriving the vLLM 0.34 test environment $venv from $base (~9.4 GB copied)" >&2
  rm -rf "$venv"
  cp -a "$base" "$venv"
  # The copy's scripts name the old venv's python: run pip as a module of the new one.
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps "$pin"
  echo "$want" >"$stamp"
  echo "connector: vLLM 0.34 environment ready in $((SECONDS - t0)) s" >&2
fi
"$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$here" >&2
echo "$venv"
