"""Failure paths that must not reach vLLM's step loop as exceptions or wrong answers: NATS errors of any kind become
ConnexError, a failed load is named by request (never by block ids as well: vLLM raises on those for a model with
several KV cache groups), a fence of an earlier leg does not fence a leg whose request.start is unanswered, and
notices connexd no longer keeps are rebuilt from its state (a lost blocks.freed must not keep vLLM's blocks)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from nats.errors import ConnectionClosedError, OutboundBufferLimitError

from connex_vllm import codes, notices
from connex_vllm import connector as connmod
from connex_vllm.bus import Bus, ConnexError
from connex_vllm.pb import notices_pb2 as npb
from connex_vllm.pb import request_pb2 as rpb
from connex_vllm.scheduler import ConnexScheduler, Stats, _Decode
from connex_vllm.worker import Completions


class _RaisingNATS:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.last_error = None

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc


@pytest.mark.parametrize("exc", [OutboundBufferLimitError(), ConnectionClosedError(), ConnectionResetError("reset")])
def test_bus_call_turns_every_nats_error_into_connex_error(exc: BaseException) -> None:
    bus = object.__new__(Bus)  # no connection: only call's error mapping is under test
    bus.member, bus.engine, bus.on_call = "m-1", "e-1", None
    bus._nc = _RaisingNATS(exc)  # type: ignore[assignment]
    with pytest.raises(ConnexError) as info:
        asyncio.run(bus.call("request.start", rpb.StartRequestMsg(), rpb.RequestStatus, 1.0))
    assert info.value.code == codes.CODE_PEER_UNAVAILABLE
    assert type(exc).__name__ in str(info.value)


class _Worker:
    def load_errors(self) -> set[int]:
        return {7, 8}

    def transfer_results(self) -> tuple[set[str], set[str], set[str]]:
        return set(), {"r1"}, {"r1"}


@pytest.mark.skipif(connmod.KVConnectorTransferResults is None, reason="vLLM before 0.32 hears of failures by block")
def test_a_failed_load_is_named_by_request_only() -> None:
    conn = object.__new__(connmod.ConnexConnector)
    conn.connector_worker = _Worker()  # type: ignore[assignment]
    res = conn.get_transfer_results(set())
    assert res.failed_recving == {"r1"} and res.finished_recving == {"r1"}
    assert conn.get_block_ids_with_load_errors() == set()


def test_a_fence_before_the_start_is_answered_is_an_earlier_leg_s() -> None:
    s = object.__new__(ConnexScheduler)
    s._mu, s.stats = threading.Lock(), Stats()
    leg = _Decode("req-2", "conn-1", None, 3)
    s._by_connex = {"conn-1": leg}
    s._on_fenced(rpb.FencedNotice(request_id="conn-1", stale_epoch=1, new_owner="m-2"))
    assert not leg.fenced, "the resumed leg on this engine was fenced by its predecessor's notice"
    leg.epoch = 2
    s._on_fenced(rpb.FencedNotice(request_id="conn-1", stale_epoch=1, new_owner="m-2"))
    assert not leg.fenced, "a fence of an older epoch fenced the leg"
    s._on_fenced(rpb.FencedNotice(request_id="conn-1", stale_epoch=2, new_owner="m-3"))
    assert leg.fenced and s.stats.fenced == 1


def test_holds_gone_gives_back_the_holds_connexd_no_longer_keeps() -> None:
    c = Completions()
    c.watch_hold("r1", "t1")
    c.watch_hold("r2", "t2")
    before = c.watched()
    c.watch_hold("r3", "t3")  # watched after the state read began: not judged by it
    assert c.holds_gone({"t2"}, before) == 1
    assert c.take() == ({"r1"}, set())
    c.blocks_freed("t1")  # its notice, late after all: no second report
    assert c.take() == (set(), set())
    c.blocks_freed("t2")
    assert c.take() == ({"r2"}, set())


def test_lost_notices_are_rebuilt_from_connexd_s_state() -> None:
    replies = [
        npb.NoticesReply(journal="j1", last_seq=9, gap=True),
        npb.NoticesReply(journal="j1", last_seq=9),
        npb.NoticesReply(journal="j1", last_seq=9),
    ]
    calls: list[str] = []

    async def fetch(journal: str, seq: int) -> npb.NoticesReply:
        return replies.pop(0)

    async def on_gap() -> None:
        calls.append("state")
        if len(calls) == 1:
            raise ConnexError(codes.CODE_TIMEOUT, "engine.state: no reply")

    f = notices.Follower(fetch, lambda n: None, name=" (test)", on_gap=on_gap)
    f.seed("j1", 2)

    async def polls() -> None:
        await f.catch_up()  # the gap: the state read fails
        await f.catch_up()  # no gap now, but the read is owed: it succeeds
        await f.catch_up()  # nothing owed

    asyncio.run(polls())
    assert calls == ["state", "state"]


class _RefusingBus:
    def __init__(self, exc: ConnexError) -> None:
        self.exc = exc

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "closes"),
    [
        (ConnexError(codes.CODE_OVERLOADED, "registry full"), True),  # connexd's own answer
        (ConnexError(codes.CODE_TIMEOUT, "connexd's own 504"), True),
        (ConnexError(codes.CODE_TIMEOUT, "no reply within 1s", answered=False), False),
        (ConnexError(codes.CODE_PEER_UNAVAILABLE, "no connexd answers", answered=False), False),
    ],
)
def test_a_renewal_connexd_refuses_still_says_it_answers(exc: ConnexError, closes: bool) -> None:
    import time
    from types import SimpleNamespace

    from connex_vllm.breaker import Unanswered

    s = object.__new__(ConnexScheduler)
    s.settings = SimpleNamespace(call_timeout_s=1.0, member="m-1")  # type: ignore[assignment]
    s._registration = lambda: None  # type: ignore[method-assign]
    s._bus = _RefusingBus(exc)  # type: ignore[assignment]
    s.holds_breaker = Unanswered(time.monotonic)
    s.holds_breaker.timed_out()
    with pytest.raises(ConnexError):
        asyncio.run(s._renew())
    assert s.holds_breaker.is_open() is not closes
