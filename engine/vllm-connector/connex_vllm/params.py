"""kv_transfer_params as vLLM carries them (a JSON dict) and as connexd speaks them (KVTransferParams).

The dict is protojson of ``connex.v1.KVTransferParams`` with proto field names (snake_case, ``data_addr`` in
base64), exactly what the router and the simulated engines put on HTTP. Keys vLLM itself adds (for example
``remote_prefill_cached_tokens``) are ignored on the way in.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from google.protobuf import json_format

from .pb import connex_pb2 as pb

_BOOLS = ("do_remote_prefill", "do_remote_decode", "connex_resume")
_STRS = ("transfer_id", "remote_engine_id", "connex_request_id")
_UINTS = ("remote_num_tokens", "tp_size", "block_size", "retain_s", "connex_resume_generated")


def _uint(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 32:
        raise ValueError(f"kv_transfer_params[{key!r}] = {v!r}: want an unsigned 32-bit integer")
    return v


def to_proto(d: dict[str, Any]) -> pb.KVTransferParams:
    """Parses a kv_transfer_params dict; unknown keys are ignored, bad values raise ValueError.

    Hand-written rather than json_format.ParseDict: it runs in a scheduler hook, where ParseDict cost ~0.2 ms.
    """
    m = pb.KVTransferParams()
    for keys, typ, what in ((_BOOLS, bool, "a boolean"), (_STRS, str, "a string")):
        for k in keys:
            v = d.get(k)
            if v is not None:
                if not isinstance(v, typ):
                    raise ValueError(f"kv_transfer_params[{k!r}] = {v!r}: want {what}")
                setattr(m, k, v)
    for k in _UINTS:
        v = d.get(k)
        if v is not None:
            setattr(m, k, _uint(k, v))
    for key, field in (("remote_block_ids", m.remote_block_ids), ("group_blocks", m.group_blocks)):
        ids = d.get(key)
        if ids is not None:
            if not isinstance(ids, list):
                raise ValueError(f"kv_transfer_params[{key!r}] = {ids!r}: want a list of unsigned integers")
            field.extend(_uint(key, i) for i in ids)
    rc = d.get("remote_ctrl")
    if rc is not None:
        if not isinstance(rc, dict):
            raise ValueError(f"kv_transfer_params['remote_ctrl'] = {rc!r}: want an object")
        m.remote_ctrl.member = str(rc.get("member", ""))
        m.remote_ctrl.backend = str(rc.get("backend", ""))
        addr = rc.get("data_addr", "")
        try:
            m.remote_ctrl.data_addr = base64.b64decode(addr, validate=True) if addr else b""
        except (binascii.Error, TypeError) as e:
            raise ValueError(f"kv_transfer_params['remote_ctrl']['data_addr']: not base64: {e}") from e
    return m


def to_dict(m: pb.KVTransferParams) -> dict[str, Any]:
    """The dict vLLM returns to its client: protojson with proto field names, zero values left out."""
    return json_format.MessageToDict(m, preserving_proto_field_name=True)


def load_tokens(remote_num_tokens: int, num_tokens: int) -> int:
    """Tokens of KV to load for a request of num_tokens tokens: a resumed request (prompt + k generated tokens)
    loads only the prompt's KV that the hold has (remote_num_tokens); vLLM computes the rest."""
    return max(0, min(remote_num_tokens, num_tokens))
