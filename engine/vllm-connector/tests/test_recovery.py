"""The connector's robustness, pure: notices caught up in order, pull.start sent again after a lost answer,
a restarted connexd (new notice journal, unknown_region) survived with a new region. No NATS: a scripted bus."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from connex_vllm import codes
from connex_vllm.bus import ConnexError
from connex_vllm.memory import KVMemory
from connex_vllm.metadata import ConnexMetadata, LoadSpec
from connex_vllm.notices import HDR_JOURNAL, HDR_SEQ, Follower
from connex_vllm.pb import connex_pb2 as pb
from connex_vllm.pb import notices_pb2 as npb
from connex_vllm.settings import parse
from connex_vllm.worker import ConnexWorker

SETTINGS = parse({"member": "m-1", "base_url": "http://127.0.0.1:8100"})


def hdr(journal: str, seq: int) -> dict[str, str]:
    return {HDR_JOURNAL: journal, HDR_SEQ: str(seq)}


def freed(tid: str, seq: int) -> npb.Notice:
    return npb.Notice(seq=seq, kind="blocks.freed", blocks_freed=pb.BlocksFreed(transfer_id=tid))


class Journal:
    """connexd's side of engine.notices: what it kept, per journal."""

    def __init__(self) -> None:
        self.kept: dict[str, list[npb.Notice]] = {}
        self.current = "j1"
        self.asked: list[tuple[str, int]] = []
        self.down = False

    async def fetch(self, journal: str, seq: int) -> npb.NoticesReply:
        self.asked.append((journal, seq))
        if self.down:
            raise ConnexError(codes.CODE_PEER_UNAVAILABLE, "engine.notices: no connexd answers")
        kept = self.kept.get(self.current, [])
        after = seq if journal == self.current else 0
        return npb.NoticesReply(
            notices=[n for n in kept if n.seq > after],
            last_seq=kept[-1].seq if kept else 0,
            journal=self.current,
            gap=journal != self.current,
        )


def follower(j: Journal) -> tuple[Follower, list[str], list[tuple[str, str]]]:
    got: list[str] = []
    restarts: list[tuple[str, str]] = []
    f = Follower(j.fetch, lambda n: got.append(n.blocks_freed.transfer_id), lambda a, b: restarts.append((a, b)))
    return f, got, restarts


def test_follower_delivers_live_notices_once_and_in_order_catching_up_a_gap() -> None:
    j = Journal()
    j.kept["j1"] = [freed(f"t{i}", i) for i in range(1, 5)]
    f, got, restarts = follower(j)
    f.seed("j1", 0)
    body = pb.BlocksFreed(transfer_id="t1").SerializeToString()
    asyncio.run(f.live("blocks.freed", body, hdr("j1", 1)))
    asyncio.run(f.live("blocks.freed", body, hdr("j1", 1)))  # NATS redelivery: dropped
    # t2 and t3 were lost while NATS reconnected: t4 arrives first and the missed ones are fetched before it.
    asyncio.run(f.live("blocks.freed", pb.BlocksFreed(transfer_id="t4").SerializeToString(), hdr("j1", 4)))
    assert got == ["t1", "t2", "t3", "t4"]
    assert j.asked == [("j1", 1)]
    assert asyncio.run(f.catch_up()) == 0 and got == ["t1", "t2", "t3", "t4"]
    assert restarts == []
    # A body that does not parse is dropped (and does not move the cursor).
    asyncio.run(f.live("blocks.freed", b"\xff\xff", hdr("j1", 5)))
    assert got == ["t1", "t2", "t3", "t4"] and f.cursor.position() == ("j1", 4)


def test_follower_polls_what_no_live_notice_announced() -> None:
    j = Journal()
    f, got, _ = follower(j)
    f.seed("j1", 0)
    j.kept["j1"] = [freed("t1", 1), freed("t2", 2)]  # both published while our subscription was down
    assert asyncio.run(f.catch_up()) == 2
    assert got == ["t1", "t2"] and f.cursor.position() == ("j1", 2)
    j.down = True  # connexd restarting: the poll fails quietly and is tried again
    assert asyncio.run(f.catch_up()) == 0 and f.cursor.position() == ("j1", 2)


def test_a_gap_whose_fetch_failed_is_fetched_at_the_next_poll() -> None:
    # t4 arrives live after a gap while engine.notices fails: t4 is handed on at once, the cursor stays before
    # the gap, and the next poll brings t2 and t3 (and t4 again: a repeat delivery, harmless) — none is lost.
    j = Journal()
    j.kept["j1"] = [freed(f"t{i}", i) for i in range(1, 5)]
    f, got, _ = follower(j)
    f.seed("j1", 1)
    j.down = True
    asyncio.run(f.live("blocks.freed", pb.BlocksFreed(transfer_id="t4").SerializeToString(), hdr("j1", 4)))
    assert got == ["t4"] and f.cursor.position() == ("j1", 1)
    j.down = False
    assert asyncio.run(f.catch_up()) == 3
    assert got == ["t4", "t2", "t3", "t4"] and f.cursor.position() == ("j1", 4)


@pytest.mark.parametrize("how", ["poll", "live"])
def test_follower_sees_a_restarted_connexd(how: str) -> None:
    j = Journal()
    f, got, restarts = follower(j)
    f.seed("j1", 7)
    j.current = "j2"
    j.kept["j2"] = [freed("n1", 1), freed("n2", 2)]
    if how == "poll":
        asyncio.run(f.catch_up())
    else:  # the new connexd's second notice reaches us first: the first is fetched
        asyncio.run(f.live("blocks.freed", pb.BlocksFreed(transfer_id="n2").SerializeToString(), hdr("j2", 2)))
    assert restarts == [("j1", "j2")]
    assert got == ["n1", "n2"], "the new journal's notices are news"
    assert f.cursor.position() == ("j2", 2)
    asyncio.run(f.catch_up())
    assert restarts == [("j1", "j2")], "reported once"


# ---- the worker, with a scripted bus and memory


class FakeMemory(KVMemory):
    def __init__(self) -> None:
        self.moves = 0
        self.fail_moves = 0
        self.info = pb.RegionInfo(region_id="r0", path="/first")

    def attach(self, kv_caches: Any, create_region: Any, views: Any = ()) -> None:
        raise AssertionError("not used")

    def move(self, create_region: Callable[[pb.Layout], pb.RegionInfo]) -> None:
        if self.fail_moves:
            self.fail_moves -= 1
            raise ConnexError(codes.CODE_PEER_UNAVAILABLE, "region.create: no connexd answers")
        self.moves += 1
        self.info = pb.RegionInfo(region_id="r0", path=f"/moved-{self.moves}")

    def close(self) -> None:
        pass


class FakeBus:
    """Runs submitted coroutines at once; pull.start answers from a script of errors (None: answered)."""

    def __init__(self, script: list[int | None]) -> None:
        self.script = script
        self.pulls: list[str] = []

    def submit(self, coro: Any) -> None:
        asyncio.run(coro)

    async def call(self, endpoint: str, msg: Any, reply: type, timeout_s: float) -> Any:
        assert endpoint == "pull.start"
        self.pulls.append(msg.pull_id)
        code = self.script.pop(0) if self.script else None
        if code is not None:
            raise ConnexError(code, f"{endpoint}: scripted {code}")
        return pb.StartPullReply()


def worker(script: list[int | None]) -> tuple[ConnexWorker, FakeBus, FakeMemory, list[float]]:
    now = [100.0]
    mem = FakeMemory()
    w = ConnexWorker(SETTINGS, "e1", 16, 1, memory=mem, now=lambda: now[0])
    bus = FakeBus(script)
    w._bus = bus  # type: ignore[assignment]
    return w, bus, mem, now


def load(req: str, blocks: tuple[int, ...] = (1, 2)) -> ConnexMetadata:
    params = pb.KVTransferParams(transfer_id=f"x-{req}").SerializeToString()
    return ConnexMetadata(loads=[LoadSpec(req, params, blocks, "")])


def test_pull_start_is_sent_again_after_a_lost_answer() -> None:
    w, bus, _, _ = worker([codes.CODE_TIMEOUT, codes.CODE_PEER_UNAVAILABLE, None])
    w.start_load(load("r1"))
    assert len(bus.pulls) == 3 and len(set(bus.pulls)) == 1, "the same pull id each time (connexd: one pull)"
    assert w.done.in_flight() == 1 and w.get_finished() == (None, None)


def test_pull_start_gives_up_after_its_attempts_or_at_once_on_a_refusal() -> None:
    w, bus, _, _ = worker([codes.CODE_TIMEOUT] * 3)
    w.start_load(load("r1"))
    assert len(bus.pulls) == 3
    assert w.get_finished() == (None, {"r1"}) and "timeout" in w.done.failures["r1"]
    w, bus, _, _ = worker([codes.CODE_FORBIDDEN])
    w.start_load(load("r2"))
    assert len(bus.pulls) == 1 and w.get_finished() == (None, {"r2"})
    assert w.load_errors() == {1, 2}


def test_a_lost_region_is_made_again_between_steps_and_the_loads_sent_again() -> None:
    w, bus, mem, now = worker([codes.CODE_UNKNOWN_REGION])
    w.bind(ConnexMetadata(holds={"p1": "h1"}))  # a hold of the old connexd (prefill side)
    w.start_load(load("r1"))  # answered unknown_region: connexd restarted under us
    assert w._lost and mem.moves == 0
    assert w.get_finished() == (None, None), "the load waits: it is neither done nor failed"
    mem.fail_moves = 1  # the new connexd is not up yet: tried again a second later, not every step
    w.bind(ConnexMetadata())
    w.bind(ConnexMetadata())
    assert mem.moves == 0 and w._lost
    now[0] += 1.5
    w.bind(ConnexMetadata(holds={"p2": "h2"}))  # named by the step that runs the move: also the old connexd's
    assert mem.moves == 1 and not w._lost and w.regions_made == 1
    assert len(bus.pulls) == 2 and bus.pulls[0] != bus.pulls[1], "the load went out again, as a new pull"
    sending, recving = w.get_finished()
    assert sending == {"p1", "p2"}, "the old connexd's holds are over: their blocks are vLLM's again"
    assert recving is None
    # The new pull completes normally.
    w._deliver(npb.Notice(seq=1, pull_done=pb.PullDone(pull_id=bus.pulls[1], ok=True)))
    assert w.get_finished() == (None, {"r1"}) and w.load_errors() == set()
    # A late pull.done of the pull that went to the old connexd changes nothing.
    w._deliver(npb.Notice(seq=2, pull_done=pb.PullDone(pull_id=bus.pulls[0], ok=False, error="old")))
    assert w.get_finished() == (None, None)


def test_a_new_journal_alone_makes_a_new_region() -> None:
    w, _, mem, _ = worker([])
    w.notices.seed("j1", 3)
    w._on_restart("j1", "j2")
    w.bind(ConnexMetadata())
    assert mem.moves == 1 and w.region is not None and w.region.path == "/moved-1"


def test_region_move_of_the_shared_memory_needs_an_attached_region() -> None:
    from connex_vllm.memory import SharedRegionMemory

    with pytest.raises(RuntimeError, match="attach"):
        SharedRegionMemory(1, 16).move(lambda layout: pb.RegionInfo())
