#!/usr/bin/env bash
# Regenerates connex_vllm/pb/*_pb2.py from messages/*.proto with the system
# protoc (Debian's protobuf-compiler). The generated files are committed;
# tests/test_proto_sync.py fails when they drift from messages/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/connex_vllm/pb}
mkdir -p "$out"
protoc -I "$root/messages" --python_out="$out" "$root/messages/connex.proto" "$root/messages/request.proto" "$root/messages/notices.proto"
# protoc writes absolute imports between generated modules; inside a package
# they must be relative.
sed -i 's/^import connex_pb2 as connex__pb2$/from . import connex_pb2 as connex__pb2/; s/^import request_pb2 as request__pb2$/from . import request_pb2 as request__pb2/' \
  "$out/request_pb2.py" "$out/notices_pb2.py"
# Python 3 reads sources as UTF-8: protoc's coding line is noise (ruff UP009).
sed -i '1{/^# -\*- coding: utf-8 -\*-$/d}' "$out"/*_pb2.py
# Generated code is not ours to lint, even when ruff is given the file by
# name (which bypasses pyproject's extend-exclude).
sed -i '1a # ruff: noqa' "$out"/*_pb2.py
