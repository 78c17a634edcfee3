// Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.

package api

// The error table. Engine shims branch on these numbers; they never change meaning.
const (
	CodeMalformed       Code = 400 // not a valid message for the endpoint
	CodeBadContentType  Code = 401 // neither application/protobuf nor application/json
	CodeNotYours        Code = 403 // the requester may not act on this transfer
	CodeUnknownTransfer Code = 404 // no such transfer on this member
	CodeUnknownRegion   Code = 405 // no such engine region registered
	CodeForbidden       Code = 406 // not allowed: an engine-scoped call naming another engine (requester, consumer, engine_id) or touching another engine's request; a region file outside region_dir, reached through a link, not a regular file, or owned by a user not in region_owner_uids
	CodeReleased        Code = 409 // already released (or freed after its pull)
	CodeExpired         Code = 410 // the lease expired and the blocks were freed
	CodeTooLarge        Code = 413 // over max_request_bytes
	CodeBadBlockIDs     Code = 422 // empty, out of range, duplicated, or counts differ
	CodeBadLayout       Code = 423 // invalid layout or it disagrees with the region file
	CodeIncompatible    Code = 424 // the two sides cannot exchange KV (another model, dtype or head size; another data plane; another TP or block size where a layout does not describe its blocks): the message names it
	CodeBlocksBusy      Code = 425 // destination blocks are being written by another pull
	CodeEngineGone      Code = 426 // the owning engine went away
	CodeBadRequest      Code = 427 // a required field is missing or out of range
	CodeFenced          Code = 428 // the request moved to another member (stale epoch); stop acting on it
	CodeOverloaded      Code = 429 // over a limit (the message names it: requests_max, holds_max_per_engine, region_max_*, a full request store, too many API calls in flight); retry later or raise it
	CodeUnknownRequest  Code = 430 // no such in-flight request on this member
	CodeRequestExists   Code = 431 // a request with that id already runs
	CodeInternal        Code = 500 // a bug; see the log
	CodeTransferFailed  Code = 502 // the data plane failed during a pull
	CodePeerUnavailable Code = 503 // the holding member or its data plane cannot be reached
	CodeTimeout         Code = 504 // past the deadline
	CodeRegionIO        Code = 507 // the region file could not be opened or mapped
	CodeRegionBroken    Code = 508 // the region's memory faulted: its file shrank (the engine truncated it) while connexd copied it; the pull failed and the region is refused from now on: create or register it again
)

// codeNames gives every code a stable name for logs and docs.
var codeNames = map[Code]string{
	CodeMalformed:       "malformed_payload",
	CodeBadContentType:  "bad_content_type",
	CodeNotYours:        "not_yours",
	CodeUnknownTransfer: "unknown_transfer",
	CodeUnknownRegion:   "unknown_region",
	CodeForbidden:       "forbidden",
	CodeReleased:        "released",
	CodeExpired:         "expired",
	CodeTooLarge:        "payload_too_large",
	CodeBadBlockIDs:     "bad_block_ids",
	CodeBadLayout:       "bad_layout",
	CodeIncompatible:    "incompatible",
	CodeBlocksBusy:      "blocks_busy",
	CodeEngineGone:      "engine_gone",
	CodeBadRequest:      "bad_request",
	CodeFenced:          "fenced",
	CodeOverloaded:      "overloaded",
	CodeUnknownRequest:  "unknown_request",
	CodeRequestExists:   "request_exists",
	CodeInternal:        "internal",
	CodeTransferFailed:  "transfer_failed",
	CodePeerUnavailable: "peer_unavailable",
	CodeTimeout:         "timeout",
	CodeRegionIO:        "region_io",
	CodeRegionBroken:    "region_broken",
}
