"""Where this engine stands in its connexd's notice journal (README "Notices").

connexd numbers every notice it sends an engine (headers ``Connex-Notice-Seq`` and ``Connex-Notice-Journal``)
and keeps the recent ones for replay (``engine.notices``). ``NoticeCursor`` is the pure bookkeeping: which live
notice to hand on, which is a repeat, and when some were missed and must be fetched first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum

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
