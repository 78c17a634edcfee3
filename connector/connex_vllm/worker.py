"""The worker-side connector: KV memory connexd serves, pulls into it, and completion reports for vLLM.

Runs in each vLLM worker process (with one rank, beside the scheduler). The step loop never waits on NATS:
``start_load`` hands pull.start to the bus thread and returns; pull.done and blocks.freed notices land in
``Completions`` on the bus thread; ``get_finished`` and ``load_errors`` only drain it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from . import bus as busmod
from . import notices
from .bus import Bus, ConnexError
from .memory import KVMemory, SharedRegionMemory
from .metadata import ConnexMetadata, LoadSpec
from .pb import connex_pb2 as pb
from .pb import notices_pb2 as npb
from .settings import Settings

log = logging.getLogger("connex_vllm")

REGION_ID = "r0"  # one region per engine: this version serves tensor-parallel size 1


@dataclass
class _Pull:
    req_id: str
    transfer_id: str
    dst_blocks: tuple[int, ...]
    deadline: float  # monotonic: no pull.done by then means the load failed (timeout)
    started: float = 0.0  # monotonic


@dataclass
class Completions:
    """Thread-safe record of what vLLM must hear from ``get_finished``: filled on the bus thread, drained in
    the step loop. Pure bookkeeping with an injected clock (``now``)."""

    now: Callable[[], float] = time.monotonic
    unclaimed_ttl_s: float = 600.0  # how long a blocks.freed for a hold we do not know yet is remembered
    _mu: threading.Lock = field(default_factory=threading.Lock)
    _pulls: dict[str, _Pull] = field(default_factory=dict)  # pull_id -> pull in flight
    _recving: set[str] = field(default_factory=set)
    _sending: set[str] = field(default_factory=set)
    _bad_blocks: set[int] = field(default_factory=set)
    _holds: dict[str, str] = field(default_factory=dict)  # transfer id -> request id
    _freed_early: dict[str, float] = field(default_factory=dict)  # transfer id -> when its freed notice came
    failures: dict[str, str] = field(default_factory=dict)  # request id -> why its load failed (for logs/tests)
    pull_us: dict[str, int] = field(default_factory=dict)  # request id -> connexd's duration of its last pull

    def pull_started(self, pull_id: str, spec: LoadSpec, transfer_id: str, timeout_s: float) -> None:
        with self._mu:
            now = self.now()
            self._pulls[pull_id] = _Pull(spec.req_id, transfer_id, spec.dst_blocks, now + timeout_s, now)

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
        with self._mu:
            now = self.now()
            for pid, p in list(self._pulls.items()):
                if now > p.deadline:
                    del self._pulls[pid]
                    self._end(p, False, f"timeout: no pull.done for pull {pid} by its deadline")
            for tid, t in list(self._freed_early.items()):
                if now - t > self.unclaimed_ttl_s:
                    del self._freed_early[tid]
            s, r = self._sending, self._recving
            self._sending, self._recving = set(), set()
            return s, r

    def take_bad_blocks(self) -> set[int]:
        with self._mu:
            b, self._bad_blocks = self._bad_blocks, set()
            return b

    def in_flight(self) -> int:
        with self._mu:
            return len(self._pulls)


class ConnexWorker:
    """One worker rank's side of the connector."""

    def __init__(
        self,
        settings: Settings,
        engine_id: str,
        block_size: int,
        tp_size: int,
        memory: KVMemory | None = None,
        num_blocks: int = 0,
    ) -> None:
        self.settings = settings
        self.engine_id = engine_id
        self.memory = memory or SharedRegionMemory(tp_size, block_size, num_blocks)
        self.done = Completions()
        self.cursor = notices.NoticeCursor()
        self._bus: Bus | None = None
        self.region: pb.RegionInfo | None = None

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError("ConnexConnector worker: register_kv_caches has not run")
        return self._bus

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor], views: Sequence[torch.Tensor] = ()) -> None:
        """At start: connect, subscribe to this engine's notices, back the KV caches (and the views of them the
        attention layers read) with a connexd region."""
        s = self.settings
        self._bus = Bus(
            s.nats_url,
            s.member,
            f"connex-vllm-worker-{self.engine_id}",
            s.connect_timeout_s,
            engine=self.engine_id,
            creds=s.nats_creds,
            tls_ca=s.nats_tls_ca,
        )
        # One subscription for every notice, handled in order; missed ones are replayed from connexd.
        self.bus.subscribe_async(busmod.engine_subject(self.engine_id, ">"), self._on_notice)
        self.bus.every(lambda: 1.0, self._catch_up_if_overdue)

        def create(layout: pb.Layout) -> pb.RegionInfo:
            req = pb.CreateRegionRequest(engine_id=self.engine_id, region_id=REGION_ID, layout=layout)
            # region.create reserves the memory up front; large regions take a while.
            return self.bus.request_sync("region.create", req, pb.RegionInfo, max(s.call_timeout_s, 60.0))

        self.memory.attach(kv_caches, create, views)
        self.region = getattr(self.memory, "info", None)
        log.info("connex: engine %s KV caches backed by connexd %s region %s", self.engine_id, s.member, REGION_ID)

    def bind(self, meta: ConnexMetadata) -> None:
        """Takes a step's metadata: watch the holds it names."""
        for req_id, tid in meta.holds.items():
            self.done.watch_hold(req_id, tid)

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
            region_id=REGION_ID,
            block_ids=list(spec.dst_blocks),
            pull_id=pull_id,
            timeout_ms=int(s.pull_timeout_s * 1000),
        )
        fut = self.bus.request("pull.start", req, pb.StartPullReply, s.call_timeout_s)

        def started(f: concurrent.futures.Future[pb.StartPullReply]) -> None:
            e = f.exception()
            if e is not None:
                code = e.code if isinstance(e, ConnexError) else 500
                self.done.pull_ended(pull_id, False, f"{busmod.reason(code)}: pull.start: {e}")

        fut.add_done_callback(started)

    async def _on_notice(self, subj: str, data: bytes, headers: dict[str, str]) -> None:
        """A live notice: in sequence it is handled; after a gap (notices lost while NATS reconnected) the
        missed ones are fetched from connexd first (engine.notices); a repeat is dropped. Bus thread only."""
        kind = subj.removeprefix(busmod.engine_subject(self.engine_id, ""))
        journal, seq = headers.get(notices.HDR_JOURNAL, ""), int(headers.get(notices.HDR_SEQ, "0") or 0)
        verdict = self.cursor.live(journal, seq)
        if verdict is notices.Verdict.REPEAT:
            return
        if verdict is notices.Verdict.CATCH_UP:
            await self._catch_up()
        if seq <= 0 or self.cursor.seen(journal, seq):
            self._handle(kind, data)

    def _handle(self, kind: str, data: bytes) -> None:
        if kind == "pull.done":
            d = pb.PullDone()
            d.ParseFromString(data)
            self._pull_done(d)
        elif kind == "blocks.freed":
            n = pb.BlocksFreed()
            n.ParseFromString(data)
            self.done.blocks_freed(n.transfer_id)

    def _pull_done(self, d: pb.PullDone) -> None:
        if d.ok:
            self.done.pull_ended(d.pull_id, True, duration_us=int(d.duration_us))
        else:
            self.done.pull_ended(d.pull_id, False, f"{busmod.reason(d.error_code)}: {d.error}")

    async def _catch_up(self) -> None:
        """Fetches and handles the notices after the cursor (engine.notices). Bus thread only."""
        journal, seq = self.cursor.position()
        req = npb.NoticesRequest(engine_id=self.engine_id, after_seq=seq, journal=journal)
        try:
            rep = await self.bus.call("engine.notices", req, npb.NoticesReply, self.settings.call_timeout_s)
        except ConnexError as e:
            log.warning("connex: engine.notices failed; missed notices are fetched again in a second: %s", e)
            return
        if rep.gap:
            log.warning(
                "connex: some missed notices are no longer kept by connexd; "
                "the pulls waiting for them fail at their deadline"
            )
        replayed = 0
        for n in rep.notices:
            if not self.cursor.seen(rep.journal, n.seq):
                continue
            replayed += 1
            if n.HasField("pull_done"):
                self._pull_done(n.pull_done)
            elif n.HasField("blocks_freed"):
                self.done.blocks_freed(n.blocks_freed.transfer_id)
        if replayed:
            log.info("connex: %d missed notices replayed (engine %s)", replayed, self.engine_id)

    async def _catch_up_if_overdue(self) -> float | None:
        """Once a second while a pull has waited over a second for its pull.done: ask connexd what was missed
        (nothing else would tell us after NATS dropped the notice)."""
        if self.done.overdue(1.0):
            await self._catch_up()
        return None

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        sending, recving = self.done.take()
        return (sending or None), (recving or None)

    def load_errors(self) -> set[int]:
        return self.done.take_bad_blocks()

    def shutdown(self) -> None:
        if self._bus is not None:
            self._bus.close()
        self.memory.close()
