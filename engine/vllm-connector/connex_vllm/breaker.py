"""Whether connexd answers: hold.create is refused at once while it does not.

``request_finished`` on a prefill engine waits for ``hold.create`` on vLLM's step loop (its params name the hold).
A connexd that does not answer (frozen, overloaded past ``call_timeout_s``) would cost every request that finishes
the whole deadline, one after another: a batch of 32 behind a SIGSTOPped connexd holds the engine for 32 deadlines.
After one ``hold.create`` went unanswered, the next ones are refused without a call — vLLM frees their blocks and
the router, finding no ``kv_transfer_params``, prefills on another engine — until a call sent after that moment is
answered, with a reply or an error of connexd's own (the engine's registration renewal, which the bus thread sends
every third of ``register_ttl_ms``, a second by default, off the step loop).

Pure: an injected clock, no I/O; thread-safe (the step loop asks, the bus thread reports answers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Unanswered:
    """Opens when a call goes unanswered; closes when a call sent after that is answered."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._mu = threading.Lock()
        self._opened_at: float | None = None  # when the last unanswered call's deadline passed
        self.opened = 0  # times it opened (connexd stopped answering)
        self.refused = 0  # calls refused without being sent while open

    def allow(self) -> bool:
        """True when a call may be sent (closed); counts a refusal otherwise."""
        with self._mu:
            if self._opened_at is None:
                return True
            self.refused += 1
            return False

    def timed_out(self) -> bool:
        """A call's deadline passed without an answer: opens. True if it was closed until now."""
        with self._mu:
            was_closed = self._opened_at is None
            self._opened_at = self._now()
            if was_closed:
                self.opened += 1
            return was_closed

    def answered(self, sent_at: float) -> bool:
        """A call sent at sent_at (this clock) was answered: closes if it was sent after the breaker opened (an
        answer to an older call says nothing of connexd now). True if it closed."""
        with self._mu:
            if self._opened_at is None or sent_at < self._opened_at:
                return False
            self._opened_at = None
            return True

    def is_open(self) -> bool:
        with self._mu:
            return self._opened_at is not None
