"""The worker-side connector: KV memory connexd serves, pulls into it, and completion reports for vLLM.

Runs in each vLLM worker process (with one rank, beside the scheduler). The step loop never waits on NATS:
``start_load`` hands pull.start to the bus thread and returns; pull.done and blocks.freed notices land in
``Completions`` on the bus thread; ``get_finished`` and ``load_errors`` only drain it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from . import bus as busmod
from . import codes, notices
from .bus import Bus, ConnexError
from .memory import KVMemory, SharedRegionMemory
from .metadata import ConnexMetadata, LoadSpec
from .pb import connex_pb2 as pb
from .pb import notices_pb2 as npb
from .settings import Settings

log = logging.getLogger("connex_vllm")

REGION_ID = "r0"  # rank 0's region (the one an engine of tensor-parallel size 1 has)


def region_id(tp_rank: int) -> str:
    """The region a worker of tensor-parallel rank tp_rank backs its KV caches with: one per rank, alike but for
    their rank (``r0`` for rank 0, the name an engine of TP 1 always had)."""
    return f"r{tp_rank}"


@dataclass
class _Pull:
    req_id: str
    transfer_id: str
    dst_blocks: tuple[int, ...]
    deadline: float  # monotonic: no pull.done by then means the load failed (timeout)
    started: float = 0.0  # monotonic
    spec: LoadSpec | None = None  # what to send again into a new region after connexd lost ours


@dataclass
class Completions:
    """Thread-safe record of what vLLM must hear from ``get_finished``: filled on the bus thread, drained in
    the step loop. Pure bookkeeping with an injected clock (``now``)."""

    now: Callable[[], float] = time.monotonic
    unclaimed_ttl_s: float = 600.0  # how long a blocks.freed for a hold we do not know yet is remembered
    _mu: threading.Lock = field(default_factory=threading.Lock)
    _pulls: dict[str, _Pull] = field(default_factory=dict)  # pull_id -> pull in flight
    _recving: set[str] = field(default_factory=set)
    _failed: set[str] = field(default_factory=set)  # requests in _recving whose load failed
    _sending: set[str] = field(default_factory=set)
    _bad_blocks: set[int] = field(default_factory=set)
    _holds: dict[str, str] = field(default_factory=dict)  # transfer id -> request id
    _freed_early: dict[str, float] = field(default_factory=dict)  # transfer id -> when its freed notice came
    failures: dict[str, str] = field(default_factory=dict)  # request id -> why its load failed (for logs/tests)
    pull_us: dict[str, int] = field(default_factory=dict)  # request id -> connexd's duration of its last pull

    def pull_started(self, pull_id: str, spec: LoadSpec, transfer_id: str, timeout_s: float) -> None:
        with self._mu:
            now = self.now()
            self._pulls[pull_id] = _Pull(spec.req_id, transfer_id, spec.dst_blocks, now + timeout_s, now, spec)

    def overdue(self, after_s: float) -> bool:
        """Whether a pull has been running for more than after_s."""
        with self._mu:
            now = self.now()
            return any(now - p.started > after_s for p in self._pulls.values())

    def pull_ended(self, pull_id: str, ok: bool, why: str = "", duration_us: int = 0) -> None:
        """A pull ended (its pull.done, or pull.start failed): vLLM hears of it in the next get_finished."""
        with self._mu:
            p = self._pulls.pop(pull_id, None)
            if p is None:
                return
            if duration_us:
                self.pull_us[p.req_id] = duration_us
                if len(self.pull_us) > 1024:
                    del self.pull_us[next(iter(self.pull_us))]
            self._end(p, ok, why)

    def _end(self, p: _Pull, ok: bool, why: str) -> None:
        self._recving.add(p.req_id)
        if not ok:
            self._failed.add(p.req_id)
            self._bad_blocks.update(p.dst_blocks)
            self.failures[p.req_id] = why
            if len(self.failures) > 1024:
                del self.failures[next(iter(self.failures))]
            log.error("connex: KV load of request %s (transfer %s) failed: %s", p.req_id, p.transfer_id, why)

    def failed_at_once(self, spec: LoadSpec) -> None:
        """A load that cannot start (it breaks a limit): reported failed in the next get_finished."""
        with self._mu:
            self._end(_Pull(spec.req_id, "", spec.dst_blocks, 0.0), False, spec.error)

    def watch_hold(self, req_id: str, transfer_id: str) -> None:
        with self._mu:
            if self._freed_early.pop(transfer_id, None) is not None:
                self._sending.add(req_id)
            else:
                self._holds[transfer_id] = req_id

    def blocks_freed(self, transfer_id: str) -> None:
        with self._mu:
            req = self._holds.pop(transfer_id, None)
            if req is not None:
                self._sending.add(req)
            else:  # the notice overtook the metadata naming the hold
                self._freed_early[transfer_id] = self.now()

    def take(self) -> tuple[set[str], set[str]]:
        """(finished sending, finished receiving) since the last call; also times out silent pulls."""
        s, r, _ = self.take_results()
        return s, r

    def take_results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving, failed receiving ⊆ finished receiving) since the last call;
        also times out silent pulls."""
        with self._mu:
            now = self.now()
            for pid, p in list(self._pulls.items()):
                if now > p.deadline:
                    del self._pulls[pid]
                    self._end(p, False, f"timeout: no pull.done for pull {pid} by its deadline")
            for tid, t in list(self._freed_early.items()):
                if now - t > self.unclaimed_ttl_s:
                    del self._freed_early[tid]
            s, r, f = self._sending, self._recving, self._failed
            self._sending, self._recving, self._failed = set(), set(), set()
            return s, r, f

    def requeue(self) -> list[LoadSpec]:
        """Takes every pull in flight back (their connexd lost the region they write): the loads to start again
        once a new region is in place. Their late pull.done notices, if any, are ignored."""
        with self._mu:
            specs = [p.spec for p in self._pulls.values() if p.spec is not None]
            self._pulls.clear()
            return specs

    def watched(self) -> set[str]:
        """The transfer ids of the holds watched now."""
        with self._mu:
            return set(self._holds)

    def holds_gone(self, live: set[str], among: set[str]) -> int:
        """The watched holds of among (watched before connexd's state was read) not in live (the transfer ids
        connexd still holds blocks for) are freed — their blocks.freed notices were lost: their blocks are vLLM's
        again in the next get_finished. A hold watched since is not judged: the state read may predate it.
        Returns how many."""
        with self._mu:
            gone = [tid for tid in self._holds if tid in among and tid not in live]
            for tid in gone:
                self._sending.add(self._holds.pop(tid))
            return len(gone)

    def drop_holds(self) -> int:
        """Every hold watched so far died with its connexd (it restarted): their blocks are vLLM's again, in the
        next get_finished. Returns how many."""
        with self._mu:
            n = len(self._holds)
            self._sending.update(self._holds.values())
            self._holds.clear()
            self._freed_early.clear()
            return n

    def take_bad_blocks(self) -> set[int]:
        with self._mu:
            b, self._bad_blocks = self._bad_blocks, set()
            return b

    def in_flight(self) -> int:
        with self._mu:
            return len(self._pulls)


class ConnexWorker:
    """One worker rank's side of the connector.

    At tensor-parallel size > 1 each rank has its own region (``region_id``) and pulls into it on its own: every
    rank sees every notice of the engine and counts only its own pulls (pull ids are the rank's), and each reports
    what finished, which vLLM's output aggregator counts over all ranks. A hold names every rank's region (the
    scheduler's ``hold.create``), so each rank reports its end too."""

    def __init__(
        self,
        settings: Settings,
        engine_id: str,
        block_size: int,
        tp_size: int,
        memory: KVMemory | None = None,
        num_blocks: int = 0,
        now: Callable[[], float] = time.monotonic,
        cpu_order: bool = False,
        tp_rank: int = 0,
        model_kv_heads: int = 0,
    ) -> None:
        """cpu_order: vLLM's CPU attention keeps its blocks in connexd's ``cpu`` order (``cpuorder.known``), so
        the region's layout is described and pulls from engines of other block sizes are translated. tp_rank of
        tp_size: this worker's rank; model_kv_heads: the model's KV heads, all ranks together (describes a rank's
        layout at TP > 1, so pulls between engines of other TP sizes are translated)."""
        self.settings = settings
        self.engine_id = engine_id
        self.tp_rank = tp_rank
        self.region_id = region_id(tp_rank)
        self.memory = memory or SharedRegionMemory(tp_size, block_size, num_blocks, cpu_order, tp_rank, model_kv_heads)
        self.done = Completions(now=now)
        self.notices = notices.Follower(
            self._fetch_notices,
            self._deliver,
            self._on_restart,
            f" of engine {engine_id}",
            on_gap=self._holds_from_state,
        )
        self._now = now
        self._bus: Bus | None = None
        self.region: pb.RegionInfo | None = None
        # Set (bus thread) when connexd lost this engine's region; the step loop makes a new one (bind).
        self._lost: str = ""
        self._lost_mu = threading.Lock()
        self._next_recovery = 0.0  # monotonic: when the step loop may try region.create again
        self.regions_made = 0  # regions made after the first (connexd restarts survived)

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError("ConnexConnector worker: register_kv_caches has not run")
        return self._bus

    @property
    def cursor(self) -> notices.NoticeCursor:
        return self.notices.cursor

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], views: Sequence[torch.Tensor] = ()) -> None:
        """At start: connect, subscribe to this engine's notices, back the KV caches (and the views of them the
        attention layers read) with a connexd region."""
        s = self.settings
        self._bus = Bus(
            s.nats_url,
            s.member,
            f"connex-vllm-worker-{self.engine_id}-tp{self.tp_rank}",
            s.connect_timeout_s,
            engine=self.engine_id,
            creds=s.nats_creds,
            tls_ca=s.nats_tls_ca,
        )
        # One subscription for every notice, handled in order; missed ones are replayed from connexd.
        self.bus.subscribe_async(busmod.engine_subject(s.member, self.engine_id, ">"), self._on_notice)
        self.memory.attach(kv_caches, self._create_region, views)
        self.region = getattr(self.memory, "info", None)
        # Where the journal stands now: notices of an earlier run of this engine are not news.
        try:
            rep = self.bus.request_sync(
                "engine.notices",
                npb.NoticesRequest(engine_id=self.engine_id, max=1),
                npb.NoticesReply,
                s.call_timeout_s,
            )
            self.notices.seed(rep.journal, rep.last_seq)
        except ConnexError as e:
            log.warning("connex: engine.notices at start failed (notices are fetched at the next poll): %s", e)
        # Once a second: missed notices, and a restarted connexd (a new journal), even when nothing else calls it.
        self.bus.every(lambda: s.notice_poll_s, self._poll)
        log.info("connex: engine %s KV caches backed by connexd %s region %s", self.engine_id, s.member, self.region_id)

    def _create_region(self, layout: pb.Layout) -> pb.RegionInfo:
        req = pb.CreateRegionRequest(engine_id=self.engine_id, region_id=self.region_id, layout=layout)
        # region.create reserves the memory up front; large regions take a while.
        return self.bus.request_sync("region.create", req, pb.RegionInfo, max(self.settings.call_timeout_s, 60.0))

    # ---- a connexd that lost this engine's region (it restarted, or the region broke)

    def _region_lost(self, why: str) -> None:
        """Marks the region lost (any thread); the step loop makes a new one at its next bind."""
        with self._lost_mu:
            if not self._lost:
                log.warning(
                    "connex: connexd %s lost engine %s's KV region: %s", self.settings.member, self.engine_id, why
                )
            self._lost = self._lost or why

    def _on_restart(self, old: str, new: str) -> None:
        self._region_lost(f"connexd restarted (notice journal {old} -> {new})")

    def _recover(self) -> None:
        """Step loop, between forward passes: a new region on the (restarted) connexd, the KV caches moved onto
        it (running requests keep their KV), the old connexd's holds given back, loads in flight sent again.
        Runs here, not on the bus thread, so that no hold is created on the new region before the KV is in it."""
        with self._lost_mu:
            why = self._lost
        if not why or self._now() < self._next_recovery:
            return
        t0 = time.monotonic()
        try:
            self.memory.move(self._create_region)
        except Exception as e:
            self._next_recovery = self._now() + 1.0
            log.warning(
                "connex: a new KV region for engine %s could not be made yet (%s); trying again", self.engine_id, e
            )
            return
        with self._lost_mu:
            self._lost = ""
        self.region = getattr(self.memory, "info", None)
        self.regions_made += 1
        dropped = self.done.drop_holds()
        specs = self.done.requeue()
        for spec in specs:
            # Its request.start was answered by the connexd that went away: the new one has no start to wait for.
            self._start_pull(replace(spec, await_start=""))
        log.warning(
            "connex: engine %s has a new KV region on connexd %s after %s (%.0f ms, KV moved; %d holds of the old "
            "connexd given back, %d loads sent again)",
            self.engine_id,
            self.settings.member,
            why,
            (time.monotonic() - t0) * 1000,
            dropped,
            len(specs),
        )

    # ---- the step loop's hooks

    def bind(self, meta: ConnexMetadata) -> None:
        """Takes a step's metadata: watch the holds it names (and, after connexd lost the region, make a new
        one: the holds named so far were the old connexd's)."""
        for req_id, tid in meta.holds.items():
            self.done.watch_hold(req_id, tid)
        if self._lost:
            self._recover()

    def start_load(self, meta: ConnexMetadata) -> None:
        """Starts the step's pulls on the bus thread; returns at once."""
        for spec in meta.loads:
            if spec.error:
                self.done.failed_at_once(spec)
                continue
            self._start_pull(spec)

    def _start_pull(self, spec: LoadSpec) -> None:
        s = self.settings
        params = pb.KVTransferParams()
        params.ParseFromString(spec.params)
        pull_id = secrets.token_hex(8)
        # Registered before pull.start goes out: its pull.done cannot overtake us.
        self.done.pull_started(pull_id, spec, params.transfer_id, s.pull_timeout_s + 2.0)
        req = pb.StartPullRequest(
            params=params,
            engine_id=self.engine_id,
            region_id=self.region_id,
            block_ids=list(spec.dst_blocks),
            skip_blocks=spec.skip_blocks,
            group_skip_blocks=list(spec.group_skip_blocks),
            pull_id=pull_id,
            timeout_ms=int(s.pull_timeout_s * 1000),
            await_start=spec.await_start,
        )
        self.bus.submit(self._send_pull(pull_id, req))

    async def _send_pull(self, pull_id: str, req: pb.StartPullRequest) -> None:
        """pull.start, sent again (same pull id: connexd treats it as the same pull) when its answer may have
        been lost with a NATS server; a lost region parks the load until a new region is in place."""
        s = self.settings
        for attempt in range(1, s.pull_start_attempts + 1):
            try:
                await self.bus.call("pull.start", req, pb.StartPullReply, s.call_timeout_s)
                return
            except ConnexError as e:
                if e.code in (codes.CODE_UNKNOWN_REGION, codes.CODE_REGION_BROKEN):
                    self._region_lost(f"pull.start answered {codes.reason(e.code)}: {e}")
                    return  # the pull stays in flight: requeued by _recover (or failed at its deadline)
                if e.code in (codes.CODE_TIMEOUT, codes.CODE_PEER_UNAVAILABLE) and attempt < s.pull_start_attempts:
                    log.warning("connex: pull.start %s not answered (%s); sending it again", pull_id, e)
                    continue
                self.done.pull_ended(pull_id, False, f"{codes.reason(e.code)}: pull.start: {e}")
                return
            except Exception as e:
                self.done.pull_ended(pull_id, False, f"{codes.reason(codes.CODE_INTERNAL)}: pull.start: {e!r}")
                return

    # ---- notices

    async def _fetch_notices(self, journal: str, seq: int) -> npb.NoticesReply:
        req = npb.NoticesRequest(engine_id=self.engine_id, after_seq=seq, journal=journal)
        return await self.bus.call("engine.notices", req, npb.NoticesReply, self.settings.call_timeout_s)

    async def _on_notice(self, subj: str, data: bytes, headers: dict[str, str]) -> None:
        """A live notice: handed on in journal order (see notices.Follower). Bus thread only."""
        kind = subj.removeprefix(busmod.engine_subject(self.settings.member, self.engine_id, ""))
        await self.notices.live(kind, data, headers)

    async def _holds_from_state(self) -> None:
        """Notices lost for good (connexd keeps a bounded journal): the holds whose blocks connexd freed meanwhile
        are read from its state, so that a lost blocks.freed does not keep vLLM's blocks forever. Bus thread."""
        before = self.done.watched()  # each created at connexd before the read below
        req = npb.EngineStateRequest(engine_id=self.engine_id)
        st = await self.bus.call("engine.state", req, npb.EngineState, self.settings.call_timeout_s)
        n = self.done.holds_gone({h.transfer_id for h in st.holds if not h.freed}, before)
        if n:
            log.info(
                "connex: %d holds of engine %s ended while their notices were lost: blocks given back",
                n,
                self.engine_id,
            )

    def _deliver(self, n: npb.Notice) -> None:
        if n.HasField("pull_done"):
            d = n.pull_done
            if d.ok:
                self.done.pull_ended(d.pull_id, True, duration_us=int(d.duration_us))
            else:
                self.done.pull_ended(d.pull_id, False, f"{codes.reason(d.error_code)}: {d.error}")
        elif n.HasField("blocks_freed"):
            self.done.blocks_freed(n.blocks_freed.transfer_id)

    async def _poll(self) -> float | None:
        """Asks connexd what was missed (nothing else would tell us after NATS dropped a notice) and, from its
        journal, whether it restarted (then the region is gone with it)."""
        await self.notices.catch_up()
        return None

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.done.take()
        return (sending or None), (recving or None)

    def transfer_results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving, failed receiving): a failed load named by its request, which
        vLLM (0.32 on) fails or recomputes by id — unambiguous where block ids alone could be matched late."""
        return self.done.take_results()

    def load_errors(self) -> set[int]:
        return self.done.take_bad_blocks()

    def shutdown(self) -> None:
        if self._bus is not None:
            self._bus.close()
        self.memory.close()
