# Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.
"""The stable error codes of connexd's NATS subject API (header ``Nats-Service-Error-Code``), their names, and how a
failed KV load reads.

Generated from api/codes.json, the one table every language shares: edit it and run ``make generate`` (or
``go generate ./api``). ``reason`` names a failure as the Go shim does (``shim.Reason``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# not a valid message for the endpoint
CODE_MALFORMED_PAYLOAD: Final = 400
# neither application/protobuf nor application/json
CODE_BAD_CONTENT_TYPE: Final = 401
# the requester may not act on this transfer
CODE_NOT_YOURS: Final = 403
# no such transfer on this member
CODE_UNKNOWN_TRANSFER: Final = 404
# no such engine region registered
CODE_UNKNOWN_REGION: Final = 405
# not allowed: an engine-scoped call naming another engine (requester, consumer, engine_id) or touching another engine's
# request; a region file outside region_dir, reached through a link, not a regular file, or owned by a user not in
# region_owner_uids
CODE_FORBIDDEN: Final = 406
# already released (or freed after its pull)
CODE_RELEASED: Final = 409
# the lease expired and the blocks were freed
CODE_EXPIRED: Final = 410
# over max_request_bytes
CODE_PAYLOAD_TOO_LARGE: Final = 413
# empty, out of range, duplicated, or counts differ
CODE_BAD_BLOCK_IDS: Final = 422
# invalid layout or it disagrees with the region file
CODE_BAD_LAYOUT: Final = 423
# the two sides cannot exchange KV (another model, dtype or head size; another data plane; another TP or block size
# where a layout does not describe its blocks): the message names it
CODE_INCOMPATIBLE: Final = 424
# destination blocks are being written by another pull
CODE_BLOCKS_BUSY: Final = 425
# the owning engine went away
CODE_ENGINE_GONE: Final = 426
# a required field is missing or out of range
CODE_BAD_REQUEST: Final = 427
# the request moved to another member (stale epoch); stop acting on it
CODE_FENCED: Final = 428
# over a limit (the message names it: requests_max, holds_max_per_engine, region_max_*, a full request store, too many
# API calls in flight); retry later or raise it
CODE_OVERLOADED: Final = 429
# no such in-flight request on this member
CODE_UNKNOWN_REQUEST: Final = 430
# a request with that id already runs
CODE_REQUEST_EXISTS: Final = 431
# a bug; see the log
CODE_INTERNAL: Final = 500
# the data plane failed during a pull
CODE_TRANSFER_FAILED: Final = 502
# the holding member or its data plane cannot be reached
CODE_PEER_UNAVAILABLE: Final = 503
# past the deadline
CODE_TIMEOUT: Final = 504
# the region file could not be opened or mapped
CODE_REGION_IO: Final = 507
# the region's memory faulted: its file shrank (the engine truncated it) while connexd copied it; the pull failed and
# the region is refused from now on: create or register it again
CODE_REGION_BROKEN: Final = 508

NAMES: Final[Mapping[int, str]] = {
    CODE_MALFORMED_PAYLOAD: "malformed_payload",
    CODE_BAD_CONTENT_TYPE: "bad_content_type",
    CODE_NOT_YOURS: "not_yours",
    CODE_UNKNOWN_TRANSFER: "unknown_transfer",
    CODE_UNKNOWN_REGION: "unknown_region",
    CODE_FORBIDDEN: "forbidden",
    CODE_RELEASED: "released",
    CODE_EXPIRED: "expired",
    CODE_PAYLOAD_TOO_LARGE: "payload_too_large",
    CODE_BAD_BLOCK_IDS: "bad_block_ids",
    CODE_BAD_LAYOUT: "bad_layout",
    CODE_INCOMPATIBLE: "incompatible",
    CODE_BLOCKS_BUSY: "blocks_busy",
    CODE_ENGINE_GONE: "engine_gone",
    CODE_BAD_REQUEST: "bad_request",
    CODE_FENCED: "fenced",
    CODE_OVERLOADED: "overloaded",
    CODE_UNKNOWN_REQUEST: "unknown_request",
    CODE_REQUEST_EXISTS: "request_exists",
    CODE_INTERNAL: "internal",
    CODE_TRANSFER_FAILED: "transfer_failed",
    CODE_PEER_UNAVAILABLE: "peer_unavailable",
    CODE_TIMEOUT: "timeout",
    CODE_REGION_IO: "region_io",
    CODE_REGION_BROKEN: "region_broken",
}
"""Every code's stable name (what connexd's logs and error bodies call it)."""

_REASONS: Final[Mapping[int, str]] = {
    CODE_UNKNOWN_TRANSFER: "unknown transfer",
    CODE_BAD_LAYOUT: "incompatible",
    CODE_ENGINE_GONE: "holder unavailable",
    CODE_PEER_UNAVAILABLE: "holder unavailable",
}


def name(code: int) -> str:
    """The stable name of ``code`` (``code_<n>`` for a code this table does not know, as connexd says)."""
    return NAMES.get(code, f"code_{code}")


def reason(code: int) -> str:
    """Names a load-failure code the way an operator reads it: its reason, else its name."""
    return _REASONS.get(code) or name(code)
