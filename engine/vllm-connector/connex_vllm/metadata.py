"""What the scheduler-side connector tells the worker-side connector each step (vLLM's KVConnectorMetadata)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class LoadSpec:
    """One decode-side load: read the hold's blocks, less its first ``skip_blocks`` (tokens the engine's prefix cache
    holds already), into the local ``dst_blocks`` (same order).

    ``params`` is the serialized KVTransferParams. ``error`` set means the load cannot even start (the request
    breaks a limit of this version, e.g. a different block size): the worker reports it failed at once, so that
    vLLM's kv_load_failure_policy applies as for any failed load.
    """

    req_id: str
    params: bytes
    dst_blocks: tuple[int, ...]
    error: str = ""
    skip_blocks: int = 0
    # A hybrid model's load past a local hit: how many of each KV cache group's blocks of the hold it leaves out.
    group_skip_blocks: tuple[int, ...] = ()
    # The start_id of the request.start sent in the same step, not awaited: connexd reads once that start is
    # answered, and fails the pull with the start's error (StartPullRequest.await_start). "": none.
    await_start: str = ""


@dataclass
class ConnexMetadata(KVConnectorMetadata):
    """Loads to start and holds to watch, from one scheduler step."""

    loads: list[LoadSpec] = field(default_factory=list)
    # request id -> transfer id of the hold over its blocks (prefill side): the worker reports the request as
    # finished sending when that hold's blocks.freed notice arrives.
    holds: dict[str, str] = field(default_factory=dict)
