"""kv_transfer_params as vLLM carries them (a JSON dict) and as connexd speaks them (KVTransferParams).

The dict is protojson of ``connex.v1.KVTransferParams`` with proto field names (snake_case, ``data_addr`` in
base64), exactly what the router and the simulated engines put on HTTP. Keys vLLM itself adds (for example
``remote_prefill_cached_tokens``) are ignored on the way in.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from .pb import connex_pb2 as pb


def to_proto(d: dict[str, Any]) -> pb.KVTransferParams:
    """Parses a kv_transfer_params dict; unknown keys are ignored, bad values raise ValueError."""
    m = pb.KVTransferParams()
    try:
        json_format.ParseDict(d, m, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise ValueError(f"kv_transfer_params: {e}") from e
    return m


def to_dict(m: pb.KVTransferParams) -> dict[str, Any]:
    """The dict vLLM returns to its client: protojson with proto field names, zero values left out."""
    return json_format.MessageToDict(m, preserving_proto_field_name=True)


def load_tokens(m: pb.KVTransferParams, num_tokens: int) -> int:
    """Tokens of KV to load for a request of num_tokens tokens: a resumed request (prompt + k generated tokens)
    loads only the prompt's KV that the hold has (remote_num_tokens); vLLM computes the rest."""
    return max(0, min(int(m.remote_num_tokens), num_tokens))
