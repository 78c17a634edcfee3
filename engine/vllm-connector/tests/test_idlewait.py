"""An idle prefill engine with holds waits for work instead of stepping every millisecond (connex_vllm.idlewait)."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from connex_vllm.idlewait import POLL_S, IdleWait, find_engine, wait_for_input


class Scheduler:
    """vLLM's Scheduler as the wait sees it: its queues, and schedule() calling the connector."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []
        self.running: list[Any] = []

    def schedule(self, connector: Callable[[], Any]) -> Any:
        return connector()


class Core:
    """vLLM's EngineCoreProc: its input queue, and step() calling the scheduler."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.input_queue: queue.Queue[Any] = queue.Queue()
        self.scheduler = scheduler

    def step(self, connector: Callable[[], Any]) -> Any:
        return self.scheduler.schedule(connector)


class Clock:
    """A fake clock that sleep() moves; on_sleep runs after each sleep (work arriving)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps = 0
        self.on_sleep: Callable[[int], None] = lambda n: None

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.sleeps += 1
        self.on_sleep(self.sleeps)

    def poll(self, q: Any, timeout: float) -> None:
        """A wait that cannot block: one poll (wait_for_input on a queue of another kind)."""
        wait_for_input(object(), timeout, self.sleep)


def caller_frame() -> FrameType:
    return sys._getframe(1)


def test_find_engine_walks_up_to_the_scheduler_and_the_engine_core() -> None:
    sch = Scheduler()
    core = Core(sch)
    e = core.step(caller_frame)
    found = find_engine(e)
    assert found is not None and found.scheduler is sch and found.input_queue is core.input_queue
    # Called from elsewhere (another vLLM layout): nothing to wait on.
    assert find_engine(sys._getframe()) is None
    assert find_engine(sch.schedule(caller_frame)) is None


def waiter(max_s: float = 0.05) -> tuple[IdleWait, Clock, Core]:
    clock = Clock()
    sch = Scheduler()
    core = Core(sch)
    w = IdleWait(max_s, clock=clock.now, wait=clock.poll)
    return w, clock, core


def test_waits_only_in_an_idle_step_with_holds() -> None:
    w, clock, core = waiter()
    frame = core.step(caller_frame)
    assert w.maybe_wait(scheduled_tokens=5, holds=3, frame=frame) == 0  # the step ran requests
    assert w.maybe_wait(scheduled_tokens=0, holds=0, frame=frame) == 0  # nothing kept: vLLM blocks on its own
    core.scheduler.waiting.append("r")  # a request waits (for blocks a hold keeps, say): step on
    assert w.maybe_wait(0, 3, frame) == 0
    core.scheduler.waiting.clear()
    core.input_queue.put("new request")
    assert w.maybe_wait(0, 3, frame) == 0
    assert clock.sleeps == 0 and w.waits == 0
    assert IdleWait(0).maybe_wait(0, 3, frame) == 0  # idle_wait_ms 0: off


def test_wait_ends_at_its_bound_or_when_work_arrives() -> None:
    w, clock, core = waiter(max_s=0.05)
    frame = core.step(caller_frame)
    assert abs(w.maybe_wait(0, 3, frame) - 0.05) < 1e-9  # nothing came: the whole bound, polling each POLL_S
    assert 49 <= clock.sleeps <= 51
    clock.sleeps = 0
    clock.on_sleep = lambda n: core.input_queue.put("new request") if n == 3 else None
    waited = w.maybe_wait(0, 3, frame)
    assert abs(waited - 0.003) < 1e-9 and clock.sleeps == 3  # the request ended the wait at the next poll
    assert w.waits == 2


def test_no_engine_found_means_no_wait() -> None:
    clock = Clock()
    w = IdleWait(0.05, clock=clock.now, wait=clock.poll)
    assert w.maybe_wait(0, 3, sys._getframe()) == 0
    assert w.maybe_wait(0, 3, Core(Scheduler()).step(caller_frame)) == 0  # looked once: not again
    assert clock.sleeps == 0


def test_a_queue_is_waited_on_not_polled() -> None:
    """On a real queue.Queue the wait blocks until a put wakes it: it looks about once, not every POLL_S, and ends
    when the work arrives, long before its bound."""
    core = Core(Scheduler())
    frame = core.step(caller_frame)
    w = IdleWait(30.0)
    timer = threading.Timer(0.2, core.input_queue.put, args=("new request",))
    timer.start()
    try:
        waited = w.maybe_wait(0, 3, frame)
    finally:
        timer.cancel()
    assert 0.15 < waited < 29, waited  # ended by the put, not by the bound
    assert w.looks <= 2, f"{w.looks} looks in {waited:.3f} s: polled, not blocked ({waited / POLL_S:.0f} polls)"
    # Nothing comes: the whole bound, in one look.
    w2 = IdleWait(0.05)
    core.input_queue.get_nowait()
    assert w2.maybe_wait(0, 3, frame) >= 0.05 and w2.looks <= 2
