"""When a decode request's generated tokens go to connexd (request.progress): the checkpoint cadence.

A checkpoint is a durable write of the request's record in connexd's store (the tokens generated so far, which a
resume decided by the cluster recomputes from). It goes out once ``every`` new tokens wait, and never sooner than
``interval_s`` after the request's previous one: on a fast engine (a few ms a token) one every ``every`` tokens would
be tens of writes a second per request, each paid in CPU by connexd, NATS and this engine's bus thread. A resume
decided by the router does not depend on it (the router resends the tokens it relayed). Pure: callers pass the time.
"""

from __future__ import annotations


def due(generated: int, reported: int, every: int, now: float, last: float, interval_s: float) -> bool:
    """Whether a request.progress call goes out now: ``generated`` tokens so far, ``reported`` of them handed out
    already, the last call handed out at ``last`` (``-inf`` before the first), all times in seconds."""
    return generated - reported >= every and now - last >= interval_s
