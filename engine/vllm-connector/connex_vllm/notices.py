"""Where this engine stands in its connexd's notice journal (docs/api.md "Notices").

connexd numbers every notice it sends an engine (headers ``Connex-Notice-Seq`` and ``Connex-Notice-Journal``)
and keeps the recent ones for replay (``engine.notices``). ``NoticeCursor`` is the pure bookkeeping: which live
notice to hand on, which is a repeat, and when some were missed and must be fetched first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from google.protobuf.message import DecodeError, Message

from .pb import connex_pb2 as pb
from .pb import notices_pb2 as npb
from .pb import request_pb2 as rpb

log = logging.getLogger("connex_vllm")

HDR_SEQ = "Connex-Notice-Seq"
HDR_JOURNAL = "Connex-Notice-Journal"


class Verdict(Enum):
    DELIVER = "deliver"  # the next one: hand it on
    REPEAT = "repeat"  # already seen (a replay overlapped live delivery): drop it
    CATCH_UP = "catch_up"  # some before it were missed: fetch them, then hand it on


@dataclass
class NoticeCursor:
    """The last notice seen, per journal (a journal is one connexd run). Thread-safe."""

    journal: str = ""
    seq: int = 0
    _mu: threading.Lock = field(default_factory=threading.Lock)

    def live(self, journal: str, seq: int) -> Verdict:
        """Judges a live notice; the caller calls ``seen`` once it handled it."""
        with self._mu:
            if seq <= 0:
                return Verdict.DELIVER  # an unnumbered notice (an older connexd)
            if journal != self.journal:
                # connexd restarted: a new journal, whose earlier notices are news too.
                self.journal, self.seq = journal, 0
            if seq <= self.seq:
                return Verdict.REPEAT
            return Verdict.DELIVER if seq == self.seq + 1 else Verdict.CATCH_UP

    def seen(self, journal: str, seq: int) -> bool:
        """Records a handled notice; False if it was already handled (a repeat)."""
        with self._mu:
            if journal != self.journal:
                self.journal, self.seq = journal, 0
            if seq <= self.seq:
                return False
            self.seq = seq
            return True

    def position(self) -> tuple[str, int]:
        with self._mu:
            return self.journal, self.seq

    def reset(self, journal: str, seq: int) -> None:
        """Stands at (journal, seq): what came before is not news."""
        with self._mu:
            self.journal, self.seq = journal, seq


Fetch = Callable[[str, int], Awaitable[npb.NoticesReply]]


class Follower:
    """Hands one engine's notices on exactly once and in order, live or replayed.

    ``live`` takes a notice as NATS delivered it; after a gap (notices lost while NATS reconnected) it first
    fetches the missed ones (``fetch``: engine.notices after the cursor); ``catch_up`` does the same on demand
    (a periodic poll, an overdue pull, a renewal reply naming a newer seq). A notice from a new journal means
    connexd restarted: ``on_restart(old, new)`` runs first (what the old connexd kept on the engine's behalf
    died with it), then the new journal's notices are news. Missed notices connexd no longer keeps (its journal
    is bounded) are lost for good: ``on_gap()`` then rebuilds what they would have said from connexd's state.
    Bus thread only (one coroutine at a time)."""

    def __init__(
        self,
        fetch: Fetch,
        deliver: Callable[[npb.Notice], None],
        on_restart: Callable[[str, str], None] | None = None,
        name: str = "",
        on_gap: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.cursor = NoticeCursor()
        self._fetch = fetch
        self._deliver = deliver
        self._on_restart = on_restart
        self._on_gap = on_gap
        self._gap_owed = False  # on_gap failed: tried again at the next fetch
        self._name = name

    def seed(self, journal: str, seq: int) -> None:
        """Starts at (journal, seq) without delivering what came before (an engine that just started)."""
        self.cursor.reset(journal, seq)

    def _journal(self, journal: str) -> None:
        old, _ = self.cursor.position()
        if journal and old and journal != old and self._on_restart is not None:
            self._on_restart(old, journal)

    async def live(self, kind: str, data: bytes, headers: dict[str, str]) -> None:
        """A live notice (subject's last tokens kind, body data, its Connex-Notice-* headers)."""
        journal, seq = headers.get(HDR_JOURNAL, ""), int(headers.get(HDR_SEQ, "0") or 0)
        n = parse_live(kind, data)
        if n is None:
            return
        n.seq = max(seq, 0)
        if seq > 0:
            self._journal(journal)
        verdict = self.cursor.live(journal, seq)
        if verdict is Verdict.REPEAT:
            return
        if verdict is Verdict.CATCH_UP and await self._fetch_missed() is None:
            # The missed ones could not be fetched: hand this one on now (what waits for it need not wait for
            # them) but leave the cursor before the gap, so the next poll fetches the gap — and this one again, a
            # repeat delivery that every delivery tolerates. Recording it would drop the missed ones for good.
            self._deliver(n)
            return
        if seq <= 0 or self.cursor.seen(journal, seq):
            self._deliver(n)

    async def catch_up(self) -> int:
        """Fetches and delivers the notices after the cursor; returns how many. A failed fetch is logged and
        tried again at the next call."""
        return await self._fetch_missed() or 0

    async def _fetch_missed(self) -> int | None:
        """catch_up; None when the fetch failed (the cursor has not moved)."""
        journal, seq = self.cursor.position()
        try:
            rep = await self._fetch(journal, seq)
        except Exception as e:
            log.debug("connex: engine.notices%s failed; tried again at the next poll: %s", self._name, e)
            return None
        self._journal(rep.journal)
        lost = rep.gap and journal == rep.journal
        if lost:
            log.warning(
                "connex: some missed notices%s are no longer kept by connexd; %s",
                self._name,
                "what they said is read from connexd's state"
                if self._on_gap
                else "what waited for them ends at its deadline",
            )
        replayed = 0
        for n in rep.notices:
            if self.cursor.seen(rep.journal, n.seq):
                replayed += 1
                self._deliver(n)
        if (lost or self._gap_owed) and self._on_gap is not None:
            try:
                await self._on_gap()
                self._gap_owed = False
            except Exception as e:
                self._gap_owed = True
                log.warning(
                    "connex: connexd's state%s could not be read after lost notices (tried again at the next poll): %s",
                    self._name,
                    e,
                )
        if rep.journal and not rep.notices:
            self.cursor.seen(rep.journal, 0)  # adopt the journal even when it has nothing for us
        if replayed:
            log.info("connex: %d missed notices%s replayed", replayed, self._name)
        return replayed


#: The live notice kinds this connector reads (each one of connexd's, subjects_gen.NOTICE_KINDS), by the field of the
#: journal's Notice its body goes in.
LIVE: dict[str, tuple[str, type[Message]]] = {
    "pull.done": ("pull_done", pb.PullDone),
    "blocks.freed": ("blocks_freed", pb.BlocksFreed),
    "request.fenced": ("fenced", rpb.FencedNotice),
}


def parse_live(kind: str, data: bytes) -> npb.Notice | None:
    """A live notice's body as a journal Notice (the form replays come in); None for a kind this connector
    does not act on. A body that does not parse is dropped with a warning (never raised into NATS)."""
    entry = LIVE.get(kind)
    if entry is None:
        return None
    field_name, cls = entry
    n = npb.Notice(kind=kind)
    try:
        getattr(n, field_name).CopyFrom(cls.FromString(data))
    except DecodeError as e:
        log.warning("connex: a %s notice that does not parse was dropped: %s", kind, e)
        return None
    return n
