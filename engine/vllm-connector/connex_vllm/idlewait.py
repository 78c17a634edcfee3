"""A prefill engine that only keeps holds waits for work instead of stepping every millisecond.

vLLM steps its engine core in a loop while any request is in its scheduler, and a request whose blocks a connector
keeps after it finished (``request_finished`` → ``delay_free``) stays there until the connector reports them free:
with nothing to schedule, each step is the scheduler's and the connector's bookkeeping, then a 1 ms sleep
(``EngineCore._process_engine_step``). vLLM's own connectors keep blocks for the moments a transfer takes; a Connex
hold keeps them for the whole decode (so that a resume pulls them again), and an idle prefill engine then spends
most of a core stepping — on a machine it shares with decode engines, their decode slows by as much
(``make bench-vllm-pace``'s CPU account). So when a step of a prefill engine schedules nothing, its scheduler has no
request waiting or running, and holds are outstanding, the connector's ``build_connector_meta`` waits up to
``idle_wait_ms`` for new work: it blocks on the engine core's input queue (where a new request, an abort, a health
check or a shutdown arrives; a ``queue.Queue``, whose ``put`` wakes the wait at once) and returns as soon as it holds
something. An input queue of another kind is polled every millisecond instead (which costs an idle engine a few per
cent of a core). The bound is long (10 s by default) because every step also keeps vLLM's worker process spinning on its
shared-memory queue for a second afterwards (``SpinCondition.busy_loop_s``); blocks a hold gave back in the meantime
are handed to vLLM at the next step, which new work starts at once. Off with data parallel (its engines step
together).

The engine core and its scheduler are found once, from the call's own stack (vLLM calls ``build_connector_meta``
from ``Scheduler.schedule`` in ``EngineCore.step``); where they are not found (another vLLM layout), the connector
never waits and the engine steps as vLLM made it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger("connex_vllm")

#: How often a wait looks at an input queue it cannot block on.
POLL_S = 0.001


def wait_for_input(q: Any, timeout: float, sleep: Callable[[float], None] = time.sleep) -> None:
    """Returns when q holds something or after timeout seconds (or sooner: the caller looks again). A
    ``queue.Queue`` is waited on through its own condition, which its ``put`` notifies; anything else is looked at
    again after POLL_S."""
    cond, items = getattr(q, "not_empty", None), getattr(q, "queue", None)
    if cond is None or items is None:
        sleep(min(POLL_S, timeout))
        return
    with cond:
        if not len(items):
            cond.wait(timeout)


@dataclass
class Engine:
    """What a wait looks at: the scheduler's queues and the engine core's input queue."""

    scheduler: Any  # has .waiting and .running
    input_queue: Any  # has .empty()


def find_engine(frame: FrameType | None) -> Engine | None:
    """The scheduler and the engine core's input queue among the callers of frame (the ``self`` of the first frame
    whose object has ``waiting`` and ``running``, then of the first with an ``input_queue``); None if either is
    missing."""
    scheduler = queue = None
    f = frame
    while f is not None and (scheduler is None or queue is None):
        obj = f.f_locals.get("self")
        if obj is not None:
            if scheduler is None and hasattr(obj, "waiting") and hasattr(obj, "running"):
                scheduler = obj
            q = getattr(obj, "input_queue", None)
            if queue is None and q is not None and callable(getattr(q, "empty", None)):
                queue = q
        f = f.f_back
    if scheduler is None or queue is None:
        return None
    return Engine(scheduler, queue)


#: The scheduler's request queues (vLLM 0.32-0.34; those a version lacks are skipped).
QUEUES = ("waiting", "kv_holding_waiting", "deferred_waiting", "running")


def idle(engine: Engine) -> bool:
    """Whether the engine has nothing to do but wait: no request in any of its scheduler's queues, nothing in its
    input queue."""
    s = engine.scheduler
    return not any(len(getattr(s, q, ())) for q in QUEUES) and engine.input_queue.empty()


class IdleWait:
    """Waits, in an idle step of a prefill engine with holds, for new work or up to max_s."""

    def __init__(
        self,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[Any, float], None] = wait_for_input,
    ) -> None:
        self.max_s = max_s
        self._clock, self._wait = clock, wait
        self._engine: Engine | None = None
        self._looked = False
        self.waits = 0  # steps that waited (tests, the benchmark)
        self.waited_s = 0.0  # time spent waiting
        self.looks = 0  # times a wait looked whether work came (a blocking wait: about once a wait)

    def maybe_wait(self, scheduled_tokens: int, holds: int, frame: FrameType | None = None) -> float:
        """In a step that scheduled nothing while holds are outstanding, waits until the engine has work or max_s
        passed; returns the seconds waited (0: no wait). frame is where to look for the engine (default: the
        caller's)."""
        if self.max_s <= 0 or scheduled_tokens or holds <= 0:
            return 0.0
        if not self._looked:
            self._looked = True
            self._engine = find_engine(frame if frame is not None else sys._getframe(1))
            if self._engine is None:
                log.warning("connex: this vLLM's engine core was not found; an idle prefill engine steps as vLLM does")
        e = self._engine
        if e is None or not idle(e):
            return 0.0
        t0 = self._clock()
        deadline = t0 + self.max_s
        while True:
            now = self._clock()
            if now >= deadline or not idle(e):
                break
            self.looks += 1
            self._wait(e.input_queue, deadline - now)
        waited = self._clock() - t0
        self.waits += 1
        self.waited_s += waited
        return waited
