"""Pure parts: settings, kv_transfer_params conversion, completion bookkeeping, generated protobuf and error codes in
sync."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from connex_vllm import settings
from connex_vllm.metadata import LoadSpec
from connex_vllm.params import load_tokens, to_dict, to_proto
from connex_vllm.pb import connex_pb2 as pb
from connex_vllm.worker import Completions

OK = {"member": "m-1", "base_url": "http://127.0.0.1:8100"}


def test_settings_defaults_and_values() -> None:
    s = settings.parse(dict(OK, release="after_pull", retain_s=30, pull_timeout_s=5))
    assert (s.member, s.release, s.retain_s, s.pull_timeout_s, s.nats_url) == (
        "m-1", "after_pull", 30, 5.0, "nats://127.0.0.1:4222"
    )  # fmt: skip


def test_settings_unknown_keys_named() -> None:
    with pytest.raises(settings.SettingsError, match="relase, retain_secs"):
        settings.parse(dict(OK, relase="on_finish", retain_secs=3))


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"member": ""}, "member"),
        ({"member": "a.b"}, "member"),
        ({"base_url": "127.0.0.1:8100"}, "base_url"),
        ({"release": "never"}, "release"),
        ({"retain_s": 0}, "retain_s"),
        ({"retain_s": True}, "retain_s"),
        ({"call_timeout_s": "5"}, "call_timeout_s"),
        ({"nats_url": "http://x"}, "nats_url"),
        ({"retain_s": 10, "pull_timeout_s": 10}, "pull_timeout_s"),
        ({"idle_wait_ms": -1}, "idle_wait_ms"),
        ({"idle_wait_ms": 60001}, "idle_wait_ms"),
        ({"worker_spin_ms": 1001}, "worker_spin_ms"),
        ({"worker_spin_ms": True}, "worker_spin_ms"),
        ({"progress_interval_ms": -1}, "progress_interval_ms"),
        ({"progress_interval_ms": 60001}, "progress_interval_ms"),
        ({"progress_interval_ms": 0.5}, "progress_interval_ms"),
    ],
)
def test_settings_bad_values_name_the_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(settings.SettingsError, match=key):
        settings.parse(dict(OK, **extra))


def test_params_round_trip_and_unknown_keys() -> None:
    m = pb.KVTransferParams(
        do_remote_prefill=True,
        transfer_id="ab" * 16,
        remote_ctrl=pb.RemoteCtrl(member="p", backend="tcp", data_addr=b"\x00\xff127.0.0.1:1"),
        remote_block_ids=[4, 5, 6],
        remote_num_tokens=40,
        tp_size=1,
        block_size=16,
        retain_s=60,
        connex_request_id="c1",
        connex_resume=True,
    )
    d = to_dict(m)
    assert to_proto(dict(d, remote_prefill_cached_tokens=0)) == m
    with pytest.raises(ValueError, match="remote_block_ids"):
        to_proto(dict(d, remote_block_ids=[-1]))
    with pytest.raises(ValueError, match="data_addr"):
        to_proto(dict(d, remote_ctrl={"data_addr": "!!"}))


def test_load_tokens_clamps_a_resume_to_the_hold() -> None:
    assert load_tokens(40, 43) == 40  # prompt + k tokens: only the prompt's KV is loaded
    assert load_tokens(40, 40) == 40
    assert load_tokens(40, 30) == 30


def spec(req: str, blocks: tuple[int, ...] = (1, 2), error: str = "") -> LoadSpec:
    return LoadSpec(req, b"", blocks, error)


def test_completions_ok_failed_and_timeout() -> None:
    now = [100.0]
    c = Completions(now=lambda: now[0])
    c.pull_started("p1", spec("r1"), "t1", 5.0)
    c.pull_started("p2", spec("r2", (7, 8)), "t2", 5.0)
    c.pull_started("p3", spec("r3", (9,)), "t3", 5.0)
    assert c.take() == (set(), set())
    c.pull_ended("p1", True)
    c.pull_ended("p2", False, "expired: gone")
    c.pull_ended("p2", True)  # a duplicate notice changes nothing
    assert c.take() == (set(), {"r1", "r2"})
    assert c.take_bad_blocks() == {7, 8}
    now[0] += 6
    assert c.take() == (set(), {"r3"})
    assert c.take_bad_blocks() == {9} and "timeout" in c.failures["r3"]
    c.failed_at_once(spec("r4", (3,), "incompatible: block_size"))
    assert c.take() == (set(), {"r4"}) and c.take_bad_blocks() == {3}


def test_completions_name_failed_loads_by_request() -> None:
    c = Completions()
    c.pull_started("p1", spec("r1"), "t1", 5.0)
    c.pull_started("p2", spec("r2", (7,)), "t2", 5.0)
    c.pull_ended("p1", True)
    c.pull_ended("p2", False, "expired: gone")
    # vLLM's get_transfer_results: a failed receive is also a finished one (it leaves the wait state).
    assert c.take_results() == (set(), {"r1", "r2"}, {"r2"})
    assert c.take_results() == (set(), set(), set())


def test_completions_freed_before_or_after_the_hold_is_known() -> None:
    c = Completions()
    c.watch_hold("r1", "t1")
    c.blocks_freed("t1")
    c.blocks_freed("t2")  # overtakes the metadata naming it
    assert c.take() == ({"r1"}, set())
    c.watch_hold("r2", "t2")
    assert c.take() == ({"r2"}, set())
    c.blocks_freed("t1")  # exactly once: a second notice names no request
    assert c.take() == (set(), set())


def test_generated_protobuf_matches_messages(tmp_path: Path) -> None:
    if shutil.which("protoc") is None:
        pytest.fail("protoc not installed (apt-get install protobuf-compiler)")
    here = Path(__file__).resolve().parents[1]
    subprocess.run([str(here / "gen-proto.sh"), str(tmp_path)], check=True)
    for name in ("connex_pb2.py", "request_pb2.py", "notices_pb2.py"):
        assert filecmp.cmp(tmp_path / name, here / "connex_vllm" / "pb" / name, shallow=False), (
            f"connex_vllm/pb/{name} is stale: run engine/vllm-connector/gen-proto.sh"
        )


def test_error_codes_match_api_codes_json() -> None:
    from connex_vllm import codes

    table = json.loads((Path(__file__).resolve().parents[3] / "api" / "codes.json").read_text())["nats"]
    stale = "connex_vllm/codes.py is not what api/codes.json says: run make generate"
    consts = {f"CODE_{e['name'].upper()}" for e in table}
    assert table and {k for k in vars(codes) if k.startswith("CODE_")} == consts, stale
    for e in table:
        assert getattr(codes, f"CODE_{e['name'].upper()}") == e["code"], stale
        assert codes.NAMES[e["code"]] == codes.name(e["code"]) == e["name"], stale
        assert codes.reason(e["code"]) == e.get("reason", e["name"]), stale
    assert len(codes.NAMES) == len(table), stale
    # A code this table does not know reads as connexd names it (Code.Name).
    assert codes.name(599) == codes.reason(599) == "code_599"


def test_notice_cursor_orders_live_and_replayed_notices() -> None:
    from connex_vllm.notices import NoticeCursor, Verdict

    c = NoticeCursor()
    assert c.live("j1", 1) is Verdict.DELIVER and c.seen("j1", 1)
    assert c.live("j1", 1) is Verdict.REPEAT
    # 2 and 3 were lost: catch up first; the replay handles them, then 4.
    assert c.live("j1", 4) is Verdict.CATCH_UP
    assert c.seen("j1", 2) and c.seen("j1", 3)
    assert not c.seen("j1", 3)  # a replay overlapping live delivery
    assert c.seen("j1", 4) and c.position() == ("j1", 4)
    # connexd restarted: a new journal starts again at 1, and its earlier notices are news.
    assert c.live("j2", 3) is Verdict.CATCH_UP
    assert c.position() == ("j2", 0)
    assert c.live("j2", 0) is Verdict.DELIVER  # unnumbered (an older connexd)


def test_store_id_keeps_valid_ids_and_digests_the_rest() -> None:
    from connex_vllm.scheduler import store_id

    assert store_id("cmpl-abc_1=2/3") == "cmpl-abc_1=2/3"
    odd = "cmpl-___prefill_addr_127.0.0.1:36709___decode_addr_127.0.0.1:41769_38713fe4-0-94da35db"
    got = store_id(odd)
    assert got.startswith("vllm-") and len(got) == 45 and got == store_id(odd) and "." not in got and ":" not in got


def test_subjects_follow_connexd_scopes() -> None:
    """The connector addresses an endpoint in the scope connexd serves it in (subjects_gen.py, generated from
    api/subjects.go): engine calls in the engine's scope, member-only endpoints (peer.grant among them) never."""
    from connex_vllm.bus import subject
    from connex_vllm.subjects_gen import ENDPOINTS, MEMBER_ONLY

    assert "peer.grant" in MEMBER_ONLY and MEMBER_ONLY < ENDPOINTS
    assert subject("m1", "request.start", "e1") == "connex.v1.m1.e.e1.request.start"
    assert subject("m1", "peer.grant", "e1") == "connex.v1.m1.peer.grant"
    assert subject("m1", "hold.create") == "connex.v1.m1.hold.create"


def test_notice_kinds_are_connexd_s() -> None:
    """Every live notice kind the connector reads is one connexd publishes (subjects_gen.NOTICE_KINDS, generated from
    api/subjects.go): a kind renamed there and not here would never arrive."""
    from connex_vllm.notices import LIVE
    from connex_vllm.subjects_gen import NOTICE_KINDS

    assert set(LIVE) <= NOTICE_KINDS, set(LIVE) - NOTICE_KINDS
    assert {"pull.done", "blocks.freed", "request.fenced"} <= set(LIVE)


def test_max_tokens_sent_with_request_start() -> None:
    from types import SimpleNamespace

    from connex_vllm.scheduler import _max_tokens

    assert _max_tokens(SimpleNamespace(max_tokens=37)) == 37  # type: ignore[arg-type]
    for absent in (None, 0, -1, True, 2**32, "16"):
        assert _max_tokens(SimpleNamespace(max_tokens=absent)) == 0  # type: ignore[arg-type]
    assert _max_tokens(SimpleNamespace()) == 0  # type: ignore[arg-type]


def test_unanswered_breaker_opens_on_a_deadline_and_closes_on_a_newer_answer() -> None:
    from connex_vllm.breaker import Unanswered

    now = [100.0]
    b = Unanswered(lambda: now[0])
    assert b.allow() and not b.is_open()
    assert b.answered(99.0) is False, "closed: an answer changes nothing"
    assert b.timed_out() is True and b.is_open() and b.opened == 1
    assert not b.allow() and not b.allow() and b.refused == 2
    # An answer to a call sent before it opened says nothing of connexd now.
    assert b.answered(99.5) is False and b.is_open()
    now[0] = 101.0
    assert b.timed_out() is False and b.opened == 1, "a second deadline while open is the same outage"
    assert b.answered(100.5) is False, "sent before the latest deadline passed"
    assert b.answered(101.0) is True and not b.is_open() and b.allow()
    assert b.refused == 2


def test_checkpoints_wait_for_tokens_and_the_interval() -> None:
    from connex_vllm.checkpoints import due

    # Times a binary float holds exactly (10.25 - 10.0 is 0.25, where 10.2 - 10.0 is not 0.2).
    inf = float("-inf")
    assert due(8, 0, 8, 10.0, inf, 0.25), "the first checkpoint is not held back"
    assert not due(7, 0, 8, 10.0, inf, 0.25), "seven of eight tokens"
    assert not due(100, 8, 8, 10.125, 10.0, 0.25), "92 tokens wait, 125 ms after the last call of a 250 ms interval"
    assert due(100, 8, 8, 10.25, 10.0, 0.25), "the interval has passed and enough tokens wait"
    assert not due(15, 8, 8, 11.0, 10.0, 0.25), "the interval has passed but seven of eight tokens wait"
    assert due(9, 8, 1, 10.0, 10.0, 0.0), "interval 0: every `every` tokens, as before"
    assert settings.parse(dict(OK)).progress_interval_ms == 200
    assert settings.parse(dict(OK, progress_interval_ms=0)).progress_interval_ms == 0
