"""The scheduler-side connector: holds on the prefill side, loads and the request actor on the decode side.

Runs in vLLM's engine-core process. Every hook reads or updates local state and hands NATS work to the bus
thread, with one exception that vLLM's contract forces: ``request_finished`` on the prefill side must return the
``kv_transfer_params`` the router forwards, and they name the hold connexd creates, so it waits for one
``hold.create`` round trip (bounded by ``call_timeout_s``; once one went unanswered, the next ones are refused at
once until connexd answers again: ``connex_vllm.breaker``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from . import breaker, checkpoints, codes, grammar, groups, notices
from . import bus as busmod
from .bus import Bus, ConnexError
from .metadata import ConnexMetadata, LoadSpec
from .params import load_tokens, to_dict, to_proto
from .pb import connex_pb2 as pb
from .pb import notices_pb2 as npb
from .pb import request_pb2 as rpb
from .settings import Settings
from .worker import REGION_ID, region_id

log = logging.getLogger("connex_vllm")

PRODUCER, CONSUMER = "kv_producer", "kv_consumer"


class RequestLike(Protocol):
    """The parts of ``vllm.v1.request.Request`` the connector reads."""

    request_id: str
    kv_transfer_params: dict[str, Any] | None
    prompt_token_ids: list[int] | None
    num_computed_tokens: int

    @property
    def all_token_ids(self) -> Any: ...

    @property
    def output_token_ids(self) -> Any: ...


@dataclass
class Stats:
    """Counters tests and the benchmark read (engine-core process only)."""

    holds_created: int = 0
    hold_errors: int = 0  # requests that got no hold (their blocks freed, no kv_transfer_params): any cause
    holds_unanswered: int = 0  # hold.create calls connexd did not answer within call_timeout_s
    loads_started: int = 0
    loads_refused: int = 0
    requests_started: int = 0
    requests_finished: int = 0
    progress_calls: int = 0
    fenced: int = 0
    grammar_advanced: int = 0  # resumed structured-output requests whose grammar went past the generated tokens
    grammar_refused: int = 0  # resumed requests whose grammar could not be advanced (their load fails)
    suffix_loads: int = 0  # loads of a hold's blocks past a local prefix-cache hit
    cached_tokens: int = 0  # tokens those loads did not pull (the engine's cache had them)
    cache_hits_computed: int = 0  # local hits a pull could not continue (not block-aligned): computed locally
    window_edges_computed: int = 0  # hybrid-model prompts a load would leave a window key short of: computed locally


@dataclass
class _Decode:
    """A decode request this engine runs: its request actor on the local connexd."""

    req_id: str  # vLLM's request id
    connex_id: str  # the request actor's id (kv_transfer_params.connex_request_id, or req_id)
    request: Any  # the vLLM Request, read for generated tokens
    num_prompt: int  # tokens the engine was given (prompt, plus k generated ones for a resume)
    last: concurrent.futures.Future[Any] | None = None  # the request's latest NATS call; the next one awaits it
    epoch: int = 0
    reported: int = 0  # generated tokens handed to request.progress
    reported_at: float = float("-inf")  # when the last request.progress was handed out (the scheduler's clock)
    fenced: bool = False
    blocks: int = 0


@dataclass
class _Pending:
    loads: list[LoadSpec] = field(default_factory=list)
    holds: dict[str, str] = field(default_factory=dict)


_STORE_ID = re.compile(r"[A-Za-z0-9_=/-]{1,128}")


def _max_tokens(request: RequestLike) -> int:
    """The request's max_tokens on this engine (vLLM's ``Request.max_tokens``; a resumed leg's is what is left),
    which connexd holds its request.progress to; 0 when vLLM gives none."""
    n = getattr(request, "max_tokens", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 2**32 else 0


def store_id(vllm_request_id: str) -> str:
    """A connexd request id for a request no Connex router named (connex_request_id unset: vLLM's own proxy or
    vllm-router): vLLM's id when connexd's request store can key it, else a digest of it (vllm-router's ids carry
    the engines' host:port)."""
    if _STORE_ID.fullmatch(vllm_request_id):
        return vllm_request_id
    return "vllm-" + hashlib.sha256(vllm_request_id.encode()).hexdigest()[:40]


class ConnexScheduler:
    """One engine's scheduler-side connector state."""

    def __init__(
        self,
        settings: Settings,
        engine_id: str,
        kv_role: str,
        block_size: int,
        num_blocks: int,
        tp_size: int,
        model: str,
        max_model_len: int,
        reasoner_for: grammar.ReasonerFor | None = None,
        reasoning_parser: str = "",
        windows: Sequence[int] = (0,),
    ) -> None:
        """windows: each KV cache group's sliding window in tokens (0: full attention), in vLLM's group order; more
        than one group is a hybrid model (connex_vllm.groups)."""
        self.settings = settings
        self.windows = tuple(windows)
        # Blocks of more than one group, or a sliding window's (only its last blocks held): connex_vllm.groups.
        self.hybrid = len(self.windows) > 1 or any(self.windows)
        # Set where grammars start after a reasoning parser's end of reasoning (connex_vllm.grammar).
        self.reasoner_for = reasoner_for
        self.reasoning_parser = reasoning_parser  # registered: the router resumes this engine's chats by replay
        self.engine_id = engine_id
        self.kv_role = kv_role
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.tp_size = tp_size
        self.model = settings.model or model
        self.max_model_len = max_model_len
        self.stats = Stats()
        # The scheduler's clock (seconds, monotonic): the checkpoints' interval; tests may replace it.
        self.clock: Callable[[], float] = time.monotonic
        # Open while connexd does not answer: hold.create is then refused without a call (connex_vllm.breaker).
        self.holds_breaker = breaker.Unanswered(time.monotonic)
        self._mu = threading.Lock()
        self._pending = _Pending()
        self._decodes: dict[str, _Decode] = {}  # vLLM request id -> decode request
        self._by_connex: dict[str, _Decode] = {}  # request actor id -> decode request
        self._held: dict[str, int] = {}  # vLLM request id -> blocks held (prefill side, until finished_sending)
        self._hits: dict[str, int] = {}  # vLLM request id -> tokens its local prefix-cache hit covers (decode side)
        self._inflight: set[concurrent.futures.Future[Any]] = set()  # request calls queued or running
        self._bus = Bus(
            settings.nats_url,
            settings.member,
            f"connex-vllm-sched-{engine_id}",
            settings.connect_timeout_s,
            engine=engine_id,
            creds=settings.nats_creds,
            tls_ca=settings.nats_tls_ca,
        )
        # The notices this half acts on (request.fenced), in journal order, missed ones fetched again when a
        # renewal reply shows the journal moved past us. Held blocks come back through the worker's
        # finished_sending (update_connector_output), which has its own catch-up.
        self.notices = notices.Follower(self._fetch_notices, self._deliver, name=f" of engine {engine_id} (scheduler)")
        try:
            if kv_role == CONSUMER:
                self._bus.subscribe_async(busmod.engine_subject(settings.member, engine_id, ">"), self._on_notice)
            rep = self._bus.request_sync(
                "engine.register", self._registration(), pb.RegisterEngineReply, settings.call_timeout_s
            )
        except Exception as e:
            self._bus.close()
            raise RuntimeError(
                f"ConnexConnector: engine.register of {engine_id} on connexd {settings.member}: {e}"
            ) from e
        self._renew_s = max(rep.renew_ms, 100) / 1000.0
        # connexd waits for a request's start before its pull reads (StartPullRequest.await_start): a load goes to
        # the worker in the step that starts its request, not a step after the start's answer.
        self._pull_awaits_start = rep.pull_awaits_start
        self.notices.seed(rep.notice_journal, rep.notice_seq)
        self._bus.every(lambda: self._renew_s, self._renew)

    # ---- registration (engine.register with load figures, renewed on the bus thread)

    def _registration(self) -> pb.RegisterEngineRequest:
        with self._mu:
            in_flight = len(self._decodes) + len(self._held)
            used = sum(d.blocks for d in self._decodes.values()) + sum(self._held.values())
        info = pb.EngineInfo(
            engine_id=self.engine_id,
            role="prefill" if self.kv_role == PRODUCER else "decode",
            model=self.model,
            base_url=self.settings.base_url,
            in_flight=in_flight,
            blocks_free=max(0, self.num_blocks - used),
            blocks_total=self.num_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            reasoning_parser=self.reasoning_parser,
        )
        return pb.RegisterEngineRequest(engine=info, ttl_ms=self.settings.register_ttl_ms)

    async def _renew(self) -> float | None:
        sent = time.monotonic()
        try:
            rep = await self._bus.call(
                "engine.register", self._registration(), pb.RegisterEngineReply, self.settings.call_timeout_s
            )
        except ConnexError as e:
            if e.answered:  # connexd refused it, but it answers
                self._answered(sent)
            raise
        self._answered(sent)
        journal, seq = self.notices.cursor.position()
        self._pull_awaits_start = rep.pull_awaits_start  # connexd may have restarted as another version
        if self.kv_role == CONSUMER and (rep.notice_journal != journal or rep.notice_seq > seq):
            await self.notices.catch_up()  # some notices never reached us (or connexd restarted)
        return max(rep.renew_ms, 100) / 1000.0

    def _answered(self, sent: float) -> None:
        if self.holds_breaker.answered(sent):
            log.warning("connex: connexd %s answers again: holds are made again", self.settings.member)

    async def _fetch_notices(self, journal: str, seq: int) -> npb.NoticesReply:
        req = npb.NoticesRequest(engine_id=self.engine_id, after_seq=seq, journal=journal)
        return await self._bus.call("engine.notices", req, npb.NoticesReply, self.settings.call_timeout_s)

    async def _on_notice(self, subj: str, data: bytes, headers: dict[str, str]) -> None:
        kind = subj.removeprefix(busmod.engine_subject(self.settings.member, self.engine_id, ""))
        await self.notices.live(kind, data, headers)

    def _deliver(self, n: npb.Notice) -> None:
        if n.HasField("fenced"):
            self._on_fenced(n.fenced)

    # ---- prefill side

    def request_finished_prefill(
        self, request: RequestLike, tables: Sequence[Sequence[int]], finished_ok: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        """Holds the request's blocks (hold.create) and returns (delay the free, kv_transfer_params). tables: the
        request's block table of each KV cache group; a hybrid model's hold spans every group's real blocks, and
        its params say how many are each group's (``group_blocks``)."""
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_decode") or not finished_ok:
            return False, None
        prompt = request.prompt_token_ids or []
        n = min(len(prompt), request.num_computed_tokens)
        nblocks = math.ceil(n / self.block_size)
        counts: list[int] = []
        if not self.hybrid:
            if n <= 0 or nblocks > len(tables[0]):
                return False, None
            blocks = list(tables[0][:nblocks])
        else:
            try:
                blocks, counts = groups.hold_blocks(tables, nblocks) if n > 0 else ([], [])
            except groups.GroupError as e:
                self.stats.hold_errors += 1
                log.error("connex: request %s's KV cache groups cannot be held: %s", request.request_id, e)
                return False, None
            if not blocks:
                return False, None
            nblocks = len(blocks)
        s = self.settings
        if not self.holds_breaker.allow():
            # connexd left a hold.create unanswered and has answered nothing sent since: not another deadline on
            # the step loop. vLLM frees the blocks; the router prefills on another engine.
            self.stats.hold_errors += 1
            return False, None
        req = pb.CreateHoldRequest(
            engine_id=self.engine_id,
            region_id=REGION_ID,
            rank_region_ids=[region_id(r) for r in range(1, self.tp_size)],
            block_ids=blocks,
            num_tokens=n,
            retain_s=s.retain_s,
            release=s.release,
        )
        try:
            rep = self._bus.request_sync("hold.create", req, pb.CreateHoldReply, s.call_timeout_s)
        except (ConnexError, concurrent.futures.TimeoutError) as e:
            self.stats.hold_errors += 1
            log.error("connex: hold.create for request %s (%d blocks) failed: %s", request.request_id, nblocks, e)
            if (isinstance(e, ConnexError) and e.code == codes.CODE_TIMEOUT and not e.answered) or isinstance(
                e, concurrent.futures.TimeoutError
            ):
                self.stats.holds_unanswered += 1
                if self.holds_breaker.timed_out():
                    log.error(
                        "connex: connexd %s did not answer hold.create within %ss: the requests that finish are "
                        "refused a hold at once (the router prefills them elsewhere) until it answers again",
                        s.member,
                        s.call_timeout_s,
                    )
            return False, None
        params = rep.params
        params.do_remote_prefill, params.do_remote_decode = True, False
        params.group_blocks.extend(counts)
        with self._mu:
            self._pending.holds[request.request_id] = params.transfer_id
            self._held[request.request_id] = nblocks
        self.stats.holds_created += 1
        return True, to_dict(params)

    def finished_sending(self, req_ids: set[str] | frozenset[str]) -> None:
        """The worker gave these requests' held blocks back to vLLM (their holds ended)."""
        with self._mu:
            for r in req_ids:
                self._held.pop(r, None)

    # ---- decode side

    def get_num_new_matched_tokens(self, request: RequestLike, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens of KV to load asynchronously: the hold's, clamped to remote_num_tokens, less any local hit."""
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_prefill"):
            return 0, False
        remote = p.get("remote_num_tokens")
        if isinstance(remote, bool) or not isinstance(remote, int):
            return 0, False  # not a hold's params: computed locally
        n = load_tokens(remote, len(request.prompt_token_ids or []))
        if self.hybrid and n > 0:
            why = ""
            if num_computed_tokens > 0 and p.get("block_size") not in (None, 0, self.block_size):
                self.stats.cache_hits_computed += 1
                why = f"{num_computed_tokens} tokens cached locally, and a hybrid model's hold of other blocks"
            elif n == len(request.prompt_token_ids or []) and groups.window_edge(n, self.windows, self.block_size):
                self.stats.window_edges_computed += 1
                why = (
                    f"its {n}-token prompt ends where a sliding window's first key lies in a block the prefill "
                    "engine freed"
                )
            if why:
                log.info("connex: request %s: %s; computing it locally instead of loading", request.request_id, why)
                return 0, False
        if num_computed_tokens > 0:
            # A local prefix-cache hit: the pull reads only the hold's blocks past it (pull.start skip_blocks), when
            # the hit ends on a block boundary of the hold too; otherwise the engine computes the rest itself.
            remote_bs = p.get("block_size") or self.block_size
            if not isinstance(remote_bs, int) or num_computed_tokens % remote_bs or num_computed_tokens >= n:
                self.stats.cache_hits_computed += 1
                log.info(
                    "connex: request %s has %d tokens cached locally (not a whole number of the hold's %s-token "
                    "blocks, or all it holds); computing the rest locally instead of loading",
                    request.request_id,
                    num_computed_tokens,
                    remote_bs,
                )
                return 0, False
            with self._mu:
                self._hits[request.request_id] = num_computed_tokens
            return n - num_computed_tokens, True
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(
        self, request: RequestLike, tables: Sequence[Sequence[int]], num_external_tokens: int
    ) -> None:
        """Records the blocks a load fills and starts the request actor (request.start) on the bus thread. tables:
        the request's block table of each KV cache group."""
        block_ids = list(tables[0]) if tables else []
        p = request.kv_transfer_params
        if not p or not p.get("do_remote_prefill"):
            return
        p["do_remote_prefill"] = False  # loaded once: a preempted request recomputes, as with vLLM's own connectors
        try:
            m = to_proto(p)
            bad = ""
        except ValueError as e:
            m, bad = pb.KVTransferParams(), str(e)
        if not bad and m.connex_resume and m.connex_resume_generated and grammar.structured(request):
            t0 = time.perf_counter()
            bad = grammar.advance(request, m.connex_resume_generated, self.reasoner_for)
            if bad:
                self.stats.grammar_refused += 1
                log.error("connex: resumed request %s cannot go on under its constraint: %s", request.request_id, bad)
            else:
                self.stats.grammar_advanced += 1
                # A resume is rare and worth a line: the operator sees the constraint carried over, and its cost.
                log.warning(
                    "connex: resumed request %s: its structured-output grammar goes on after the %d generated tokens "
                    "(%s, advanced in %.2f ms)",
                    request.request_id,
                    m.connex_resume_generated,
                    type(request.structured_output_request.grammar).__name__,
                    (time.perf_counter() - t0) * 1000,
                )
        with self._mu:
            cached = self._hits.pop(request.request_id, 0)
        spec: LoadSpec | None = None
        if num_external_tokens > 0:
            # The first blocks hold the local prefix-cache hit (cached tokens); the load fills the ones after it.
            first = cached // self.block_size
            nblocks = math.ceil(num_external_tokens / self.block_size)
            dst = tuple(block_ids[first : first + nblocks])
            skip = cached // (m.block_size or self.block_size)
            group_skips: tuple[int, ...] = ()
            if self.hybrid or m.group_blocks:
                dst, group_skips, why = self._group_load(m, tables, first, nblocks)
                skip, bad = 0, bad or why
            else:
                bad = bad or self._incompatible(m, num_external_tokens, nblocks, skip)
            spec = LoadSpec(
                request.request_id, m.SerializeToString(), dst, bad, skip_blocks=skip, group_skip_blocks=group_skips
            )
            if cached and not bad:
                self.stats.suffix_loads += 1
                self.stats.cached_tokens += cached
            if bad:
                with self._mu:
                    self._pending.loads.append(spec)
                self.stats.loads_refused += 1
                log.error("connex: request %s cannot load its KV: %s", request.request_id, bad)
            else:
                self.stats.loads_started += 1
                if self._pull_awaits_start:
                    # To the worker with this step: connexd holds the pull until this leg's request.start (its
                    # start_id) is answered.
                    spec = replace(spec, await_start=secrets.token_hex(8))
                    with self._mu:
                        self._pending.loads.append(spec)
        if not bad:
            self._start_request(request, m, len(block_ids), spec)

    def _group_load(
        self, m: pb.KVTransferParams, tables: Sequence[Sequence[int]], first: int, nblocks: int
    ) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        """(destination blocks, each group's blocks of the hold left out, "") of a hybrid model's load: every
        group's real blocks at positions [first, first + nblocks) paired with the hold's of that group
        (connex_vllm.groups), or ((), (), why not). Blocks move whole: one block size and TP size."""
        if (m.block_size and m.block_size != self.block_size) or (m.tp_size and m.tp_size != self.tp_size):
            return (
                (),
                (),
                (
                    "incompatible: a hybrid model's KV moves between engines of one block size and TP size (the "
                    f"hold's {m.block_size} and TP {m.tp_size}, this engine's {self.block_size} and TP {self.tp_size})"
                ),
            )
        counts = list(m.group_blocks) or [len(m.remote_block_ids)]
        if sum(counts) != len(m.remote_block_ids):
            return (), (), f"incompatible: the hold has {len(m.remote_block_ids)} blocks, its groups {sum(counts)}"
        try:
            dst, skips = groups.load_blocks(tables, first, nblocks, counts)
        except groups.GroupError as e:
            return (), (), f"incompatible: {e}"
        return tuple(dst), tuple(skips) if any(skips) else (), ""

    def _incompatible(self, m: pb.KVTransferParams, tokens: int, nblocks: int, skip: int = 0) -> str:
        """Why the hold in m, less its first skip blocks (a local prefix-cache hit), cannot fill nblocks blocks of
        this engine with tokens tokens ("" when it can). Between block sizes connexd regroups the tokens (when both
        engines' layouts are described: otherwise pull.start answers ``incompatible`` and vLLM's
        kv_load_failure_policy decides)."""
        remote_bs = m.block_size or self.block_size
        have = len(m.remote_block_ids) - skip
        if remote_bs == self.block_size:
            if have != nblocks:
                return f"incompatible: the hold has {have} blocks past the cached ones, {tokens} tokens need {nblocks}"
            return ""
        if tokens + skip * remote_bs != m.remote_num_tokens:
            return (
                f"incompatible: a pull between block sizes {remote_bs} and {self.block_size} moves all "
                f"{m.remote_num_tokens - skip * remote_bs} tokens of the hold past the cached ones, {tokens} asked"
            )
        if len(m.remote_block_ids) != math.ceil(m.remote_num_tokens / remote_bs):
            return (
                f"incompatible: the hold has {len(m.remote_block_ids)} blocks of block_size {remote_bs} for "
                f"{m.remote_num_tokens} tokens (want {math.ceil(m.remote_num_tokens / remote_bs)})"
            )
        return ""

    def _start_request(
        self, request: RequestLike, m: pb.KVTransferParams, nblocks: int, spec: LoadSpec | None = None
    ) -> None:
        """request.start on the bus thread. connexd binds the hold to this engine when the request starts (or moves
        to it at a resume's takeover), and a bound hold serves only its engine: a load (spec) sent with await_start
        is with the worker already (connexd holds its pull until the start is answered, and fails it with the
        start's error); any other goes to the worker once the start is answered."""
        connex_id = m.connex_request_id or store_id(request.request_id)
        tokens = list(request.all_token_ids)
        d = _Decode(request.request_id, connex_id, request, len(tokens), blocks=nblocks)

        async def start() -> None:
            # Built here, on the bus thread: a message with the whole prompt is not the step loop's work.
            msg = rpb.StartRequestMsg(
                request_id=connex_id,
                params=m,
                prompt_token_ids=tokens,
                engine_id=self.engine_id,
                takeover=m.connex_resume,
                resume_authority="router",
                max_tokens=_max_tokens(request),
                start_id=spec.await_start if spec is not None else "",
            )
            t0 = time.perf_counter()
            try:
                st = await self._bus.call("request.start", msg, rpb.RequestStatus, self.settings.call_timeout_s)
            except Exception as e:
                if spec is not None and not spec.await_start:  # the load fails; kv_load_failure_policy decides
                    why = codes.reason(e.code) if isinstance(e, ConnexError) else "internal"
                    self._load_ready(replace(spec, error=f"{why}: request.start: {e}"))
                raise
            d.epoch = st.state.epoch
            if spec is not None and not spec.await_start:
                self._load_ready(spec)
            if m.connex_resume:
                # A takeover is rare and worth a line: what it cost before the pull could start.
                log.warning(
                    "connex: request %s taken over at epoch %d: request.start answered in %.1f ms",
                    connex_id,
                    d.epoch,
                    (time.perf_counter() - t0) * 1000,
                )

        with self._mu:
            self._decodes[d.req_id] = d
            self._by_connex[connex_id] = d
        self.stats.requests_started += 1
        self._then(d, start, "request.start")

    def _load_ready(self, spec: LoadSpec) -> None:
        """Hands a load to the worker with the next step's metadata. Bus thread."""
        with self._mu:
            self._pending.loads.append(spec)

    def _then(self, d: _Decode, step: Any, what: str) -> None:
        """Runs step on the bus thread after the request's previous call ended (calls of one request stay ordered)."""
        prev = d.last

        async def run() -> None:
            if prev is not None:
                await asyncio.wait([asyncio.wrap_future(prev)])
            if d.fenced:
                return
            try:
                await step()
            except ConnexError as e:
                if e.code == codes.CODE_FENCED:
                    self._fence(d, str(e))
                elif e.code == codes.CODE_UNKNOWN_REQUEST and not d.fenced:
                    # connexd keeps no record of it (its hold never existed, or it ended there): nothing more to
                    # report; the engine finishes the request on what it has.
                    d.fenced = True
                    log.info("connex: request %s has no record at connexd (%s): it reports no more", d.connex_id, e)
                else:
                    log.warning("connex: %s of request %s failed: %s", what, d.connex_id, e)
            except Exception:
                # Not an API answer (a bug, a malformed message): said, never left unread in the future.
                log.exception("connex: %s of request %s failed unexpectedly", what, d.connex_id)

        fut = self._bus.submit(run())
        d.last = fut
        with self._mu:
            self._inflight.add(fut)
        fut.add_done_callback(self._call_ended)

    def _call_ended(self, fut: concurrent.futures.Future[Any]) -> None:
        with self._mu:
            self._inflight.discard(fut)

    def _fence(self, d: _Decode, why: str) -> None:
        if not d.fenced:
            d.fenced = True
            self.stats.fenced += 1
            log.warning("connex: request %s was taken over elsewhere (%s): it reports nothing more", d.connex_id, why)

    def _on_fenced(self, n: rpb.FencedNotice) -> None:
        with self._mu:
            d = self._by_connex.get(n.request_id)
        # Epoch 0: this leg's request.start has not been answered, so the fence is of an earlier leg on this
        # engine (a resume switched back here); were it this leg's, its next call is refused as fenced.
        if d is not None and d.epoch > 0 and n.stale_epoch >= d.epoch:
            self._fence(d, f"moved to {n.new_owner}")

    def build_meta(self) -> ConnexMetadata:
        """The step's metadata for the worker, and request.progress batches for running decode requests."""
        with self._mu:
            pend, self._pending = self._pending, _Pending()
            decodes = list(self._decodes.values())
        every = self.settings.progress_every
        now, interval = self.clock(), self.settings.progress_interval_ms / 1000
        for d in decodes:
            if d.fenced:
                continue
            out = d.request.output_token_ids
            if checkpoints.due(len(out), d.reported, every, now, d.reported_at, interval):
                toks = list(out[d.reported :])
                d.reported += len(toks)
                d.reported_at = now
                self._progress(d, toks)
        return ConnexMetadata(loads=pend.loads, holds=pend.holds)

    def _progress(self, d: _Decode, toks: list[int]) -> None:
        async def progress() -> None:
            msg = rpb.RequestProgress(request_id=d.connex_id, epoch=d.epoch, token_ids=toks)
            await self._bus.call("request.progress", msg, rpb.RequestStatus, self.settings.call_timeout_s)

        self.stats.progress_calls += 1
        self._then(d, progress, "request.progress")

    def request_finished_decode(self, request: RequestLike) -> tuple[bool, dict[str, Any] | None]:
        """The request ended: request.finish (the request actor releases the prefill hold), on the bus thread."""
        with self._mu:
            self._hits.pop(request.request_id, None)
            d = self._decodes.pop(request.request_id, None)
            if d is not None and self._by_connex.get(d.connex_id) is d:
                del self._by_connex[d.connex_id]
        if d is not None:

            async def finish() -> None:
                msg = rpb.FinishRequestMsg(request_id=d.connex_id, epoch=d.epoch)
                await self._bus.call("request.finish", msg, rpb.RequestStatus, self.settings.call_timeout_s)

            self.stats.requests_finished += 1
            self._then(d, finish, "request.finish")
        return False, None

    def holds_outstanding(self) -> int:
        """Holds whose blocks have not come back yet (prefill side)."""
        with self._mu:
            return len(self._held)

    def drain(self, timeout_s: float) -> bool:
        """Waits for every queued request call to end (tests, benchmarks, shutdown); True if all did."""
        with self._mu:
            futs = list(self._inflight)
        done, _ = concurrent.futures.wait(futs, timeout_s)
        return len(done) == len(futs)

    def shutdown(self) -> None:
        """engine.gone (its holds end, its region is unmapped there), then the connection closes."""
        try:
            self._bus.request_sync(
                "engine.gone",
                pb.EngineGoneRequest(engine_id=self.engine_id),
                pb.EngineGoneReply,
                self.settings.call_timeout_s,
            )
        except Exception as e:
            log.warning("connex: engine.gone of %s: %s", self.engine_id, e)
        self._bus.close()
