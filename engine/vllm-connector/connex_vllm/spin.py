"""A prefill engine's worker stops spinning soon after a step instead of a second after it.

vLLM's multiprocess executor hands each step to its worker processes through a shared-memory queue whose reader spins
(``sched_yield`` in a loop) for ``busy_loop_s`` — one second, fixed — after every message before it sleeps on a
socket the writer pings with each message. That buys a decode engine, which steps every few milliseconds, a quicker
start of each step. A prefill engine behind Connex steps in bursts (a prefill, then nothing while its holds keep the
blocks), so each burst costs it up to a second of a core spent spinning: on a host whose cores it shares with decode
engines or Connex's processes, their time (``make bench-vllm-pace``'s thread account showed the prefill engine's
worker as its largest user). The connector shortens the spin of a prefill engine's worker to ``worker_spin_ms``
(default 20: the steps of one chunked prefill still follow each other without a sleep); a step after a longer pause
starts when the writer's ping wakes the worker, a fraction of a millisecond later.

The queue is found once, when the worker registers its KV caches (vLLM calls ``register_kv_caches`` from the
worker's RPC loop, ``WorkerProc.worker_busy_loop``): the ``self`` of a calling frame with ``rpc_broadcast_mq`` whose
reader has a ``SpinCondition`` (vLLM 0.32-0.34). Where it is not found (another executor or vLLM layout) nothing
changes.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

log = logging.getLogger("connex_vllm")


def find_spin(frame: FrameType | None) -> Any | None:
    """The reader SpinCondition of the worker's RPC queue among the callers of frame, or None."""
    f = frame
    while f is not None:
        obj = f.f_locals.get("self")
        mq = getattr(obj, "rpc_broadcast_mq", None) if obj is not None else None
        spin = getattr(mq, "_spin_condition", None)
        if spin is not None and isinstance(getattr(spin, "busy_loop_s", None), (int, float)):
            return spin
        f = f.f_back
    return None


def shorten(spin_s: float, frame: FrameType | None = None) -> bool:
    """Sets the worker's spin after each message to spin_s seconds (when it spins longer); returns whether the
    queue was found. frame is where to look (default: the caller's)."""
    spin = find_spin(frame if frame is not None else sys._getframe(1))
    if spin is None:
        log.warning("connex: this vLLM's worker queue was not found; its worker spins after each step as vLLM makes it")
        return False
    if spin.busy_loop_s > spin_s:
        spin.busy_loop_s = spin_s
    return True
