"""``ConnexConnector``: vLLM's ``KVConnectorBase_V1`` over a local connexd.

vLLM builds one instance per process and role: the scheduler role in the engine-core process
(``scheduler.ConnexScheduler``) and the worker role in each worker process (``worker.ConnexWorker``). This class
only checks the limits at start and routes vLLM's hooks to the role's half.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

try:  # vLLM 0.32 on: failed loads reported by request id (get_transfer_results)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
except ImportError:  # pragma: no cover (older vLLM: get_finished and invalid block ids only)
    KVConnectorTransferResults = None  # type: ignore[assignment,misc]

from . import cpuorder, spin
from .idlewait import IdleWait
from .metadata import ConnexMetadata
from .scheduler import ConnexScheduler
from .settings import ROLES, Settings, SettingsError, parse, valid_token
from .worker import ConnexWorker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("connex_vllm")


def check_limits(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None) -> tuple[Settings, str]:
    """Parses the settings and checks this version's limits; returns (settings, engine id) or raises."""
    settings, engine_id = _check_engine(vllm_config)
    windows(kv_cache_config)
    return settings, engine_id


def windows(kv_cache_config: KVCacheConfig | None) -> tuple[int, ...]:
    """Each KV cache group's sliding window in tokens (0: every block kept, full attention), in vLLM's group order;
    raises SettingsError for a group this version cannot serve. A hybrid model (vLLM's hybrid KV cache manager
    on, which declaring ``SupportsHMA`` keeps on) has several; see connex_vllm.groups."""
    if kv_cache_config is None:
        return (0,)
    groups = kv_cache_config.kv_cache_groups
    out: list[int] = []
    sizes: set[int] = set()
    for g in groups:
        spec = g.kv_cache_spec
        # Exactly these two: their subclasses (MLA, sink, bounded-replay windows) keep other state.
        if type(spec) not in (FullAttentionSpec, SlidingWindowSpec):
            raise SettingsError(
                f"ConnexConnector: KV cache spec {type(spec).__name__}; this version serves full-attention and "
                "sliding-window attention with K and V (no MLA, Mamba or chunked local attention)"
            )
        # A full-attention group keeps every block even where its layers read a window (the hybrid manager off).
        out.append(int(spec.sliding_window) if type(spec) is SlidingWindowSpec else 0)
        sizes.add(int(spec.block_size))
    if len(sizes) > 1:
        raise SettingsError(f"ConnexConnector: KV cache groups of block sizes {sorted(sizes)}; this version needs one")
    return tuple(out) or (0,)


def _check_engine(vllm_config: VllmConfig) -> tuple[Settings, str]:
    """The settings and the engine-wide limits (role, engine id, parallelism, MLA)."""
    ktc = vllm_config.kv_transfer_config
    assert ktc is not None
    settings = parse(ktc.kv_connector_extra_config)
    if ktc.kv_role not in ROLES:
        raise SettingsError(f"ConnexConnector: kv_role {ktc.kv_role!r}; allowed: {', '.join(ROLES)}")
    engine_id = str(ktc.engine_id or "")
    if not valid_token(engine_id):
        raise SettingsError(
            f"ConnexConnector: kv_transfer_config engine_id {engine_id!r} must be one NATS subject token "
            "(no spaces, '.', '*' or '>')"
        )
    par = vllm_config.parallel_config
    if par.pipeline_parallel_size != 1:
        raise SettingsError(
            f"ConnexConnector: pipeline_parallel_size {par.pipeline_parallel_size}: this version serves every layer "
            "from each rank's region (pipeline_parallel_size must be 1; any tensor_parallel_size is served)"
        )
    if vllm_config.model_config is not None and vllm_config.model_config.use_mla:
        raise SettingsError(
            "ConnexConnector: MLA models are not supported (this version serves full attention with K and V)"
        )
    return settings, engine_id


def tp_size(vllm_config: VllmConfig) -> int:
    """The engine's tensor-parallel size: its workers' ranks, each with a region of its own."""
    return int(vllm_config.parallel_config.tensor_parallel_size or 1)


def tp_rank() -> int:
    """This worker's tensor-parallel rank (0 where vLLM's TP group is not set up: a single-rank engine)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (AssertionError, ImportError):  # no TP group yet (unit tests, an engine without one)
        return 0


def model_kv_heads(vllm_config: VllmConfig) -> int:
    """The model's KV heads, all ranks together (0 when the config cannot say): what describes a rank's share."""
    try:
        return int(vllm_config.model_config.get_total_num_kv_heads())
    except Exception:  # a model config without it: the layout stays undescribed at TP > 1
        return 0


def layer_views(vllm_config: VllmConfig) -> list[torch.Tensor]:
    """The KV cache tensors vLLM bound to its attention layers (``layer.kv_cache``): views of the tensors
    ``register_kv_caches`` gets (kernel-block views on some backends), which must move to connexd's region
    with them."""
    ctx = getattr(vllm_config.compilation_config, "static_forward_context", None) or {}
    out: list[torch.Tensor] = []
    for layer in ctx.values():
        kv = getattr(layer, "kv_cache", None)
        for t in kv if isinstance(kv, (list, tuple)) else [kv]:
            if isinstance(t, torch.Tensor) and t.numel() > 0:
                out.append(t)
    return out


def reasoning_parser(vllm_config: VllmConfig) -> str:
    """The reasoning parser this engine's chat layer runs (``--reasoning-parser``); "" for none."""
    so = getattr(vllm_config, "structured_outputs_config", None)
    return str(getattr(so, "reasoning_parser", "") or "")


def reasoner_factory(vllm_config: VllmConfig) -> Callable[[Any], Any] | None:
    """On an engine whose grammars start only once a reasoning parser sees the reasoning end, what builds a request's
    reasoner exactly as vLLM's ``StructuredOutputManager._get_reasoner`` does (the engine's parser class, its
    tokenizer, the request's ``reasoning_parser_kwargs``; kept on the request, where vLLM then reuses it), for
    connex_vllm.grammar; None elsewhere."""
    so = getattr(vllm_config, "structured_outputs_config", None)
    name = reasoning_parser(vllm_config)
    if not name or bool(getattr(so, "enable_in_reasoning", False)):
        return None
    state: dict[str, Any] = {}

    def reasoner_for(request: Any) -> Any:
        sr = request.structured_output_request
        if sr.reasoner is None:
            if "cls" not in state:  # once: loading the tokenizer is not the step loop's work more than once
                from vllm.reasoning import ReasoningParserManager
                from vllm.tokenizers import cached_tokenizer_from_config

                plugin = getattr(so, "reasoning_parser_plugin", "") or ""
                if len(plugin) > 3:
                    ReasoningParserManager.import_reasoning_parser(plugin)
                state["cls"] = ReasoningParserManager.get_reasoning_parser(name)
                state["tokenizer"] = cached_tokenizer_from_config(model_config=vllm_config.model_config)
            sr.reasoner = state["cls"](tokenizer=state["tokenizer"], **(sr.reasoning_parser_kwargs or {}))
        return sr.reasoner

    return reasoner_for


class ConnexConnector(KVConnectorBase_V1, SupportsHMA):
    """Prefill (kv_producer) keeps a request's KV as a renewable hold in connexd; decode (kv_consumer) pulls it,
    possibly again after a resume. See docs/architecture/vllm-connector.md. ``SupportsHMA``: vLLM keeps its
    hybrid KV cache manager on (a sliding-window group keeps only its window's blocks), and a hold spans every
    group (connex_vllm.groups)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        settings, engine_id = check_limits(vllm_config, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        assert ktc is not None
        self.engine_id = engine_id
        self.kv_role = str(ktc.kv_role)
        block_size = int(vllm_config.cache_config.block_size)
        self.connector_scheduler: ConnexScheduler | None = None
        self.idle_wait: IdleWait | None = None
        self.connector_worker: ConnexWorker | None = None
        if role == KVConnectorRole.SCHEDULER:
            num_blocks = int(kv_cache_config.num_blocks) if kv_cache_config is not None else 0
            mc = vllm_config.model_config
            self.connector_scheduler = ConnexScheduler(
                settings,
                engine_id,
                self.kv_role,
                block_size,
                num_blocks,
                tp_size(vllm_config),
                str(mc.served_model_name if mc is not None else ""),
                int(mc.max_model_len) if mc is not None else 0,
                reasoner_for=reasoner_factory(vllm_config),
                reasoning_parser=reasoning_parser(vllm_config),
                windows=windows(kv_cache_config),
            )
            # Not with data parallel: its engines step together, and one that waits would hold the others.
            dp = int(getattr(vllm_config.parallel_config, "data_parallel_size", 1) or 1)
            if self.kv_role == "kv_producer" and settings.idle_wait_ms > 0 and dp == 1:
                self.idle_wait = IdleWait(settings.idle_wait_ms / 1000)
        else:
            num_blocks = int(kv_cache_config.num_blocks) if kv_cache_config is not None else 0
            self.connector_worker = ConnexWorker(
                settings,
                engine_id,
                block_size,
                tp_size(vllm_config),
                num_blocks=num_blocks,
                cpu_order=cpuorder.known(vllm_config, block_size),
                tp_rank=tp_rank(),
                model_kv_heads=model_kv_heads(vllm_config),
            )

    # ---- worker role

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        assert self.connector_worker is not None
        self.connector_worker.register_kv_caches(kv_caches, layer_views(self._vllm_config))
        if self.kv_role == "kv_producer":
            spin.shorten(self.connector_worker.settings.worker_spin_ms / 1000, sys._getframe(1))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert self.connector_worker is not None and isinstance(connector_metadata, ConnexMetadata)
        self.connector_worker.bind(connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        assert self.connector_worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, ConnexMetadata)
        self.connector_worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: a request runs only after its whole load finished

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # the KV cache is connexd's memory: nothing to save

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self.connector_worker is not None
        return self.connector_worker.get_finished()

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        assert self.connector_worker is not None
        if KVConnectorTransferResults is None:  # pragma: no cover
            return super().get_transfer_results(finished_req_ids)  # type: ignore[misc]
        sending, recving, failed = self.connector_worker.transfer_results()
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self.connector_worker is not None
        bad = self.connector_worker.load_errors()
        if KVConnectorTransferResults is not None:
            # vLLM 0.32 on hears of a failed load by request id (get_transfer_results' failed_recving), which it
            # fails or recomputes whole; block ids as well would make it raise for a model with several KV cache
            # groups (a hybrid model: block ids are unique only within a group).
            return set()
        return bad

    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()

    # ---- scheduler role

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.connector_scheduler is not None
        if self.kv_role != "kv_consumer":
            return 0, False
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        """vLLM 0.34+: how the workers reach the KV cache vLLM allocates. ``IN_PROCESS``: each worker rebinds its KV
        tensors onto a connexd region of its own (the file connexd maps and registers with UCX), so vLLM's
        allocation is never registered or exported and may take any form. Earlier vLLMs do not ask."""
        from vllm.config.kv_transfer import KVCacheAccess

        return KVCacheAccess.IN_PROCESS

    def may_load_async(self, request: Request) -> bool:
        """vLLM 0.34+ (``--max-num-inflight-kv-loads``): whether ``get_num_new_matched_tokens`` may answer an async
        load for the request: a decode engine's request whose params name a hold (``remote_num_tokens``)."""
        if self.kv_role != "kv_consumer":
            return False
        p = request.kv_transfer_params
        remote = p.get("remote_num_tokens") if p else None
        return bool(p and p.get("do_remote_prefill")) and isinstance(remote, int) and not isinstance(remote, bool)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        assert self.connector_scheduler is not None
        if self.kv_role != "kv_consumer":
            return
        self.connector_scheduler.update_state_after_alloc(request, blocks.get_block_ids(), num_external_tokens)

    def get_loaded_kv_cache_group_ids(self, request: Request) -> tuple[int, ...]:
        """Every group a load fills (a hold spans them all), so vLLM does not zero the loaded blocks of any."""
        cfg = self._kv_cache_config
        ids = getattr(cfg, "transfer_group_ids", None)
        return tuple(ids) if ids is not None else tuple(range(len(cfg.kv_cache_groups) if cfg is not None else 1))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.connector_scheduler is not None
        meta = self.connector_scheduler.build_meta()
        if self.idle_wait is not None:  # a prefill engine that only keeps holds waits for work (connex_vllm.idlewait)
            self.idle_wait.maybe_wait(
                int(getattr(scheduler_output, "total_num_scheduled_tokens", 1)),
                self.connector_scheduler.holds_outstanding(),
                sys._getframe(1),
            )
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """``SupportsHMA``: the request's blocks of every KV cache group (null blocks where a window no longer
        reads); a prefill engine holds the real ones of each."""
        assert self.connector_scheduler is not None
        from vllm.v1.request import RequestStatus

        if self.kv_role == "kv_producer":
            ok = request.status in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
            return self.connector_scheduler.request_finished_prefill(request, block_ids, ok)
        return self.connector_scheduler.request_finished_decode(request)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        super().update_connector_output(connector_output)
        if self.connector_scheduler is not None and connector_output.finished_sending:
            self.connector_scheduler.finished_sending(connector_output.finished_sending)

    def has_pending_block_frees(self) -> bool:
        # Held prefill blocks come back when their holds end (release or retain_s): waiting beats preempting.
        return self.connector_scheduler is not None and self.connector_scheduler.holds_outstanding() > 0
