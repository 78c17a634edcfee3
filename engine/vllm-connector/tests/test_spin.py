"""A prefill engine's worker spins briefly after a step, not vLLM's second (connex_vllm.spin)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from connex_vllm import spin


class SpinCondition:
    def __init__(self) -> None:
        self.busy_loop_s = 1.0


class MessageQueue:
    def __init__(self) -> None:
        self._spin_condition = SpinCondition()


class WorkerProc:
    """vLLM's WorkerProc as the connector sees it: its RPC queue, and the busy loop that calls into the worker."""

    def __init__(self) -> None:
        self.rpc_broadcast_mq = MessageQueue()

    def worker_busy_loop(self, call: Callable[[], Any]) -> Any:
        return call()


def caller_frame() -> FrameType:
    return sys._getframe(1)


def test_shortens_the_spin_of_the_worker_that_called() -> None:
    w = WorkerProc()
    frame = w.worker_busy_loop(caller_frame)
    assert spin.shorten(0.02, frame)
    assert w.rpc_broadcast_mq._spin_condition.busy_loop_s == 0.02
    assert spin.shorten(0.5, frame)  # never longer than it was
    assert w.rpc_broadcast_mq._spin_condition.busy_loop_s == 0.02


def test_no_worker_queue_found_changes_nothing() -> None:
    assert not spin.shorten(0.02, sys._getframe())
    w = WorkerProc()
    w.rpc_broadcast_mq._spin_condition = None  # type: ignore[assignment]  # a writer's queue: no reader spin
    assert not spin.shorten(0.02, w.worker_busy_loop(caller_frame))
