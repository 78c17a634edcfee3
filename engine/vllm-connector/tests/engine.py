"""One vLLM engine for the tests: vLLM's real Scheduler with ConnexConnector in both roles, on CPU.

The model runner's part is played here (vLLM's compiled ops need a GPU): each ``step`` runs the worker-side
connector hooks in the order vLLM's model runner does (bind metadata, start_load_kv, forward, get_finished,
get_block_ids_with_load_errors), writes the KV of every computed position into the KV cache tensors as the
attention layers would, samples one token per request from the KV the request sees, and hands vLLM a
ModelRunnerOutput with the KVConnectorOutput.
"""

from __future__ import annotations

import copy
import inspect
import os
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from cluster import creds
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from connex_vllm.connector import ConnexConnector

MODEL_DIR = str(Path(__file__).parent / "model")
BLOCK_SIZE = 16
NUM_LAYERS = 2
NUM_KV_HEADS = 2
HEAD_SIZE = 16
DTYPE = torch.bfloat16
VOCAB = 1024

init_none_hash(sha256)


def kv_value(
    token: int, pos: int, layer: int, plane: int, heads: int = NUM_KV_HEADS, head_size: int = HEAD_SIZE
) -> torch.Tensor:
    """The KV the 'model' writes for one token at one position (one slot: num_kv_heads x head_size)."""
    base = (token * 131 + pos * 17 + layer * 7 + plane * 3) % 1000
    return (torch.arange(heads * head_size, dtype=torch.float32) + base).reshape(heads, head_size).to(DTYPE)


# vLLM 0.34 dropped ModelRunnerOutput.req_id_to_index (the order of req_ids is the index).
_RUNNER_OUTPUT_INDEX = "req_id_to_index" in inspect.signature(ModelRunnerOutput).parameters
# vLLM 0.32 added get_transfer_results and KVConnectorOutput.failed_recving (failed loads named by request).
_TRANSFER_RESULTS = "failed_recving" in inspect.signature(KVConnectorOutput).parameters


class Engine:
    """A scheduler plus the worker-side connector of rank 0, in one process."""

    def __init__(
        self,
        role: str,
        member: str,
        nats_url: str,
        engine_id: str,
        num_blocks: int = 64,
        policy: str = "fail",
        extra: dict[str, Any] | None = None,
        kv_fn: Any = None,
        layers: int = NUM_LAYERS,
        heads: int = NUM_KV_HEADS,
        head_size: int = HEAD_SIZE,
        prefix_caching: bool = False,
    ) -> None:
        self.engine_id = engine_id
        self.layers = tuple(f"model.layers.{i}.self_attn.attn" for i in range(layers))
        self.heads, self.head_size = heads, head_size
        # (token, pos, layer, plane) -> one slot of KV
        self.kv_fn = kv_fn or (lambda t, p, li, pl: kv_value(t, p, li, pl, heads, head_size))
        cfg = {"member": member, "nats_url": nats_url, "base_url": f"http://127.0.0.1:1/{engine_id}", **(extra or {})}
        engine_creds = creds(nats_url, "--role", "engine", "--member", member, "--engine", engine_id)
        if engine_creds:
            cfg.setdefault("nats_creds", engine_creds)
        model_config = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=2048, dtype="bfloat16")
        self.vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=SchedulerConfig(
                max_num_seqs=16,
                max_num_batched_tokens=2048,
                max_model_len=2048,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=prefix_caching),
            device_config=DeviceConfig("cpu"),
            kv_transfer_config=KVTransferConfig(
                kv_connector="ConnexConnector",
                kv_connector_module_path="connex_vllm",
                kv_role=role,
                engine_id=engine_id,
                kv_connector_extra_config=cfg,
                kv_load_failure_policy=policy,
            ),
        )
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    list(self.layers),
                    FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=heads, head_size=head_size, dtype=DTYPE),
                )
            ],
        )
        self.vllm_config.cache_config.num_gpu_blocks = num_blocks
        # The worker side first, as vLLM does: the KV caches are registered before the first request.
        self.worker = ConnexConnector(self.vllm_config, KVConnectorRole.WORKER, self.kv_cache_config)
        self.kv = {n: torch.zeros(2, num_blocks, BLOCK_SIZE, heads, head_size, dtype=DTYPE) for n in self.layers}
        self.worker.register_kv_caches(self.kv)
        self.sched = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=BLOCK_SIZE,
            log_stats=True,
        )
        conn = self.sched.connector
        assert isinstance(conn, ConnexConnector)
        self.conn: ConnexConnector = conn
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.outputs: dict[str, list[Any]] = {}
        self.steps = 0

    @property
    def connector_sched(self) -> Any:
        assert self.conn.connector_scheduler is not None
        return self.conn.connector_scheduler

    def add(
        self, req_id: str, prompt: list[int], max_tokens: int, kv_transfer_params: dict[str, Any] | None
    ) -> Request:
        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        if kv_transfer_params is not None:
            # A copy, as each HTTP request parses its own (the connector marks a loaded request's params).
            sp.extra_args = {"kv_transfer_params": copy.deepcopy(kv_transfer_params)}
        req = Request(req_id, prompt, sp, None, block_hasher=self.hasher)
        self.sched.add_request(req)
        return req

    def free_blocks(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def block_ids(self, req_id: str) -> list[int]:
        return list(self.sched.kv_cache_manager.get_block_ids(req_id)[0])

    def slot(self, blocks: list[int], pos: int) -> tuple[int, int]:
        return blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE

    def _slot_index(self, req_id: str, positions: range) -> torch.Tensor:
        blocks = self.block_ids(req_id)
        return torch.tensor(
            [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions], dtype=torch.long
        )

    def kv_slots(self, req_id: str, positions: range) -> torch.Tensor:
        """The request's KV at positions as one tensor [layer, plane, pos, heads, head_size] (copied out)."""
        idx = self._slot_index(req_id, positions)
        per_layer = [t.flatten(1, 2).index_select(1, idx) for t in (self.kv[n] for n in self.layers)]
        return torch.stack(per_layer)

    def kv_bytes(self, req_id: str, positions: range) -> bytes:
        """The KV bytes a request sees at positions, read from the KV cache tensors (what attention reads)."""
        return self.kv_slots(req_id, positions).contiguous().view(torch.uint8).numpy().tobytes()

    def expected_kv(self, tokens: list[int], positions: range) -> bytes:
        """What kv_bytes must be if every position holds the KV this engine's model writes for tokens."""
        out = torch.stack(
            [
                torch.stack([torch.stack([self.kv_fn(tokens[p], p, li, pl) for p in positions]) for pl in (0, 1)])
                for li in range(len(self.layers))
            ]
        )
        return out.contiguous().view(torch.uint8).numpy().tobytes()

    def step(self) -> Any:
        """One engine step: schedule, the worker's connector hooks and 'forward', update_from_output."""
        so = self.sched.schedule()
        w = self.worker
        meta = so.kv_connector_metadata
        assert meta is not None
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)  # type: ignore[arg-type]
        req_ids, sampled = [], []
        for req_id, n in so.num_scheduled_tokens.items():
            req = self.sched.requests[req_id]
            blocks = self.block_ids(req_id)
            end = req.num_computed_tokens  # already advanced by schedule()
            toks = list(req.all_token_ids)
            for pos in range(end - n, end):
                b, s = self.slot(blocks, pos)
                for li, layer in enumerate(self.layers):
                    for plane in (0, 1):
                        self.kv[layer][plane, b, s] = self.kv_fn(toks[pos], pos, li, plane)
            req_ids.append(req_id)
            if end >= req.num_tokens:  # the last prompt chunk or a decode step: sample from the KV it sees
                sampled.append([3 + zlib.crc32(self.kv_bytes(req_id, range(end))) % (VOCAB - 3)])
            else:
                sampled.append([])
        w.wait_for_save()
        # As vLLM's model runner does: get_transfer_results (0.32 on: failed loads named by request), then the
        # block ids of failed loads.
        failed: set[str] | None = None
        if _TRANSFER_RESULTS:
            tr = w.get_transfer_results(so.finished_req_ids)
            sending, recving, failed = tr.finished_sending, tr.finished_recving, tr.failed_recving
        else:
            sending, recving = w.get_finished(so.finished_req_ids)
        invalid = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        out_fields: dict[str, Any] = {
            "finished_sending": sending,
            "finished_recving": recving,
            "invalid_block_ids": invalid,
        }
        if failed is not None:
            out_fields["failed_recving"] = failed
        fields: dict[str, Any] = {
            "req_ids": req_ids,
            "sampled_token_ids": sampled,
            "kv_connector_output": KVConnectorOutput(**out_fields),
        }
        if _RUNNER_OUTPUT_INDEX:  # vLLM before 0.34 also took the index of each request id
            fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        mro = ModelRunnerOutput(**fields)
        eco = self.sched.update_from_output(so, mro)
        self.steps += 1
        for outs in eco.values():
            for o in outs.outputs:
                self.outputs.setdefault(o.request_id, []).append(o)
        return so

    def finished(self, req_id: str) -> Any:
        """The request's final EngineCoreOutput, or None while it runs."""
        for o in self.outputs.get(req_id, []):
            if o.finish_reason is not None:
                return o
        return None

    def run_until(self, what: str, cond: Any, timeout_s: float = 15.0) -> Any:
        """Steps until cond() is truthy (the loads and notices arrive asynchronously), with a deadline."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"engine {self.engine_id}: {what} not within {timeout_s}s")
            so = self.step()
            if so.total_num_scheduled_tokens == 0:
                # As vLLM's engine core does when no model ran (a request waits for its KV, or blocks wait to
                # be freed): yield the GIL for 1 ms so the connector's NATS thread makes progress.
                time.sleep(0.001)

    def step_until_scheduled(self, req_id: str, timeout_s: float = 15.0) -> Any:
        """Steps until req_id is scheduled; returns that step's SchedulerOutput."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            so = self.step()
            if req_id in so.num_scheduled_tokens:
                return so
        raise AssertionError(f"engine {self.engine_id}: {req_id} not scheduled within {timeout_s}s")

    def close(self) -> None:
        self.conn.shutdown()
        self.worker.shutdown()
