"""Prefill -> decode through vLLM's real Scheduler with ConnexConnector, against real connexd processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Connexd, wait_for
from conftest import Cluster
from engine import BLOCK_SIZE, Engine, kv_value
from vllm.v1.request import RequestStatus

from connex_vllm.pb import connex_pb2 as pb
from connex_vllm.pb import request_pb2 as rpb
from connex_vllm.settings import SettingsError

PROMPT = [(i * 37 + 11) % 1000 + 3 for i in range(40)]  # 40 tokens: 3 blocks, the last one partial
NBLOCKS = 3


@pytest.fixture(scope="module")
def engines(cluster: Cluster) -> Iterator[dict[str, Engine]]:
    made: dict[str, Engine] = {}
    try:
        made["prefill"] = Engine("kv_producer", cluster.prefill.member, cluster.nats_url, "eng-pre-0")
        made["fail"] = Engine("kv_consumer", cluster.decode1.member, cluster.nats_url, "eng-dec-1", policy="fail")
        made["recompute"] = Engine(
            "kv_consumer", cluster.decode2.member, cluster.nats_url, "eng-dec-2", policy="recompute"
        )
        yield made
    finally:
        for e in made.values():
            e.close()


def prefill(ep: Engine, req_id: str) -> dict[str, Any]:
    """Runs a prefill leg (max_tokens 1, do_remote_decode) and returns the kv_transfer_params it answers."""
    ep.add(req_id, PROMPT, 1, {"do_remote_decode": True, "do_remote_prefill": False})
    out = ep.run_until(f"prefill of {req_id}", lambda: ep.finished(req_id))
    params = out.kv_transfer_params
    assert params and params["do_remote_prefill"] and params["remote_num_tokens"] == len(PROMPT)
    assert len(params["remote_block_ids"]) == NBLOCKS
    return dict(params)


def hold(cluster: Cluster, tid: str) -> pb.HoldStatus:
    return cluster.api.request_sync("hold.inspect", pb.HoldRef(transfer_id=tid), pb.HoldStatus, 5.0)


def test_prefill_load_release_blocks_back(cluster: Cluster, engines: dict[str, Engine]) -> None:
    ep, ed = engines["prefill"], engines["fail"]
    total = ep.free_blocks()
    params = prefill(ep, "r1")
    # request_finished kept the blocks: they belong to the hold until connexd frees them.
    assert ep.free_blocks() == total - NBLOCKS
    st = hold(cluster, params["transfer_id"])
    assert st.state == "held" and not st.freed

    params["connex_request_id"] = "conn-r1"  # what the router sets on the decode leg
    ed.add("r1", PROMPT, 4, params)
    so = ed.step()
    req = ed.sched.requests["r1"]
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    # The load went to the worker in the step that started the request, not a step after request.start's answer:
    # connexd holds the pull until the start is answered (StartPullRequest.await_start).
    loads = [(ld.req_id, bool(ld.await_start)) for ld in so.kv_connector_metadata.loads]
    assert loads == [("r1", True)], loads
    loads = ed.connector_sched.stats.loads_started
    ed.run_until("load of r1", lambda: req.status == RequestStatus.RUNNING)
    # vLLM recomputes the last prompt token after a full-prompt hit; every other position came from the pull.
    assert ed.kv_bytes("r1", range(len(PROMPT) - 1)) == ep.expected_kv(PROMPT, range(len(PROMPT) - 1))
    assert ed.connector_sched.stats.loads_started == loads
    assert ep.free_blocks() == total - NBLOCKS, "prefill blocks must stay held while decode runs"
    st = wait_for("the pull counted", lambda: (s := hold(cluster, params["transfer_id"])).pulls_done == 1 and s)
    assert st.state == "held"

    ed.run_until("decode of r1", lambda: ed.finished("r1"))
    assert len(ed.finished("r1").new_token_ids) >= 1
    # request.finish -> the request actor releases the hold -> blocks.freed -> finished_sending on prefill.
    ep.run_until("prefill blocks back", lambda: ep.free_blocks() == total)
    st = hold(cluster, params["transfer_id"])
    assert st.freed and st.state == "released"


def test_resume_on_third_scheduler_loads_only_remote_tokens(cluster: Cluster, engines: dict[str, Engine]) -> None:
    ep, ed2 = engines["prefill"], engines["recompute"]
    total = ep.free_blocks()
    holds_before = ep.connector_sched.stats.holds_created
    params = prefill(ep, "r2")
    params["connex_request_id"] = "conn-r2"

    # The first decode engine, beside a connexd that dies mid-request.
    doomed = Connexd("dec-doomed", "decode", cluster.nats_url)
    ek = Engine(
        "kv_consumer", doomed.member, cluster.nats_url, "eng-doomed", extra={"call_timeout_s": 1.0, "progress_every": 1}
    )
    try:
        ek.add("r2", PROMPT, 16, params)
        req = ek.sched.requests["r2"]
        ek.run_until("load on the doomed engine", lambda: len(req.output_token_ids) >= 3)
        generated = list(req.output_token_ids)
        doomed.kill()
    finally:
        ek.close()
        doomed.kill()

    # The router resends prompt + k tokens with the same params (connex_resume) to the third scheduler.
    k = len(generated)
    resumed = PROMPT + generated
    rparams = dict(params, connex_resume=True)
    # The test plays the router: its word that the third engine may take the request over (peer.grant, members and
    # admins only; under NATS auth an engine's takeover without it is refused).
    grant = rpb.StartRequestMsg(request_id="conn-r2", engine_id=ed2.engine_id, takeover=True)
    router = cluster.on(cluster.decode2.member)
    try:
        router.request_sync("peer.grant", grant, rpb.RequestStatus, 5.0)
    finally:
        router.close()
    ed2.add("r2-resumed", resumed, 3, rparams)
    n, is_async = ed2.connector_sched.get_num_new_matched_tokens(ed2.sched.requests["r2-resumed"], 0)
    assert (n, is_async) == (len(PROMPT), True), "a resume loads remote_num_tokens, not prompt + k"
    so = ed2.step()
    rr = ed2.sched.requests["r2-resumed"]
    assert rr.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert "r2-resumed" not in so.num_scheduled_tokens
    so = ed2.step_until_scheduled("r2-resumed")
    # Only the k generated tokens are computed locally: the prompt's KV came from the same hold.
    assert so.num_scheduled_tokens.get("r2-resumed") == k
    assert ed2.kv_bytes("r2-resumed", range(len(PROMPT))) == ep.expected_kv(PROMPT, range(len(PROMPT)))
    assert ed2.kv_bytes("r2-resumed", range(len(resumed))) == ep.expected_kv(resumed, range(len(resumed)))

    # Exactly one hold for the request, pulled twice; the request actor now runs on dec-2 with the next epoch.
    assert ep.connector_sched.stats.holds_created == holds_before + 1
    st = hold(cluster, params["transfer_id"])
    assert st.state == "held" and st.pulls_done == 2
    info = cluster.api.request_sync(
        "region.inspect", pb.RegionRef(engine_id="eng-pre-0", region_id="r0"), pb.RegionInfo, 5.0
    )
    assert info.blocks_held == NBLOCKS
    rs = cluster.api.request_sync("request.inspect", rpb.RequestRef(request_id="conn-r2"), rpb.RequestStatus, 5.0)
    assert rs.state.owner == cluster.decode2.member and rs.state.engine_id == "eng-dec-2"
    assert rs.state.epoch >= 2

    ed2.run_until("resumed decode", lambda: ed2.finished("r2-resumed"))
    ep.run_until("prefill blocks back after the resume", lambda: ep.free_blocks() == total)
    assert hold(cluster, params["transfer_id"]).freed


def test_checkpoints_wait_for_the_interval(cluster: Cluster, engines: dict[str, Engine]) -> None:
    """progress_interval_ms bounds a request's request.progress calls in time, through vLLM's real Scheduler and a
    real connexd: with the scheduler's clock held still, one checkpoint goes out (the first is not held back) and the
    tokens after it wait; once the interval has passed, the next step sends them all, and connexd's record holds
    every generated token in order."""
    ep = engines["prefill"]
    total = ep.free_blocks()
    now = [1000.0]
    ed = Engine(
        "kv_consumer",
        cluster.decode1.member,
        cluster.nats_url,
        "eng-dec-cp",
        extra={"progress_every": 1, "progress_interval_ms": 200},
    )
    try:
        ed.connector_sched.clock = lambda: now[0]
        params = prefill(ep, "cp1")
        params["connex_request_id"] = "conn-cp1"
        req = ed.add("cp1", PROMPT, 12, params)
        stats = ed.connector_sched.stats
        ed.run_until("six tokens of cp1", lambda: len(req.output_token_ids) >= 6)
        assert stats.progress_calls == 1, f"{stats.progress_calls} checkpoints with the clock held still, want 1"
        assert ed.connector_sched.drain(5.0)
        first = list(req.output_token_ids[:1])

        def generated() -> list[int]:
            ref = rpb.RequestRef(request_id="conn-cp1")
            st = cluster.api.request_sync("request.inspect", ref, rpb.RequestStatus, 5.0).state
            return list(st.generated_token_ids)

        assert generated() == first, "the record holds the first checkpoint's token, and nothing after it yet"
        now[0] += 0.25  # past the 200 ms interval (exact in binary, unlike 0.2)
        ed.step()
        assert stats.progress_calls == 2
        sent = list(req.output_token_ids)
        assert ed.connector_sched.drain(5.0)
        got = generated()
        assert len(got) >= 6 and got == sent[: len(got)], f"the second sends every token since: {got} of {sent}"
        ed.run_until("decode of cp1", lambda: ed.finished("cp1"))
        ep.run_until("prefill blocks back after cp1", lambda: ep.free_blocks() == total)
    finally:
        ed.close()


def test_prefix_cached_decode_pulls_only_the_rest(cluster: Cluster, engines: dict[str, Engine]) -> None:
    """A decode engine with prefix caching on (issue 45): a second request whose first two blocks the engine caches
    (a chat's second turn) pulls only the hold's last block (pull.start skip_blocks) into the block after them,
    and sees every position's KV as the prefill wrote it."""
    ep = engines["prefill"]
    total = ep.free_blocks()
    # The decode engine's own 'model' writes other KV than the prefill's: a position it computed would show.
    other = Engine(
        "kv_consumer",
        cluster.decode1.member,
        cluster.nats_url,
        "eng-dec-pc",
        prefix_caching=True,
        kv_fn=lambda t, p, li, pl: -kv_value(t, p, li, pl),
    )
    try:
        first = prefill(ep, "pc1")
        first["connex_request_id"] = "conn-pc1"
        r1 = other.add("pc1", PROMPT, 2, first)
        other.run_until("load of pc1", lambda: r1.status == RequestStatus.RUNNING)
        cached = other.block_ids("pc1")[:2]
        other.run_until("decode of pc1", lambda: other.finished("pc1"))
        ep.run_until("prefill blocks back", lambda: ep.free_blocks() == total)

        second_prompt = PROMPT[:32] + [(i * 53 + 7) % 1000 + 3 for i in range(8)]
        ep.add("pc2", second_prompt, 1, {"do_remote_decode": True, "do_remote_prefill": False})
        second = dict(ep.run_until("prefill of pc2", lambda: ep.finished("pc2")).kv_transfer_params)
        second["connex_request_id"] = "conn-pc2"
        stats = other.connector_sched.stats
        before = (stats.suffix_loads, stats.cached_tokens, stats.loads_started)
        other.add("pc2", second_prompt, 2, second)
        req = other.sched.requests["pc2"]
        other.run_until("load of pc2", lambda: req.status == RequestStatus.RUNNING)
        assert (stats.suffix_loads, stats.cached_tokens, stats.loads_started) == (
            before[0] + 1,
            before[1] + 32,
            before[2] + 1,
        ), "one load, of the blocks past the 32 cached tokens"
        assert other.block_ids("pc2")[:2] == cached, "the cached blocks are reused, not loaded again"
        n = len(second_prompt) - 1  # vLLM computes the last prompt token itself
        assert other.kv_bytes("pc2", range(n)) == ep.expected_kv(second_prompt, range(n))
        st = wait_for("the pull counted", lambda: (s := hold(cluster, second["transfer_id"])).pulls_done == 1 and s)
        assert st.state == "held"
        other.run_until("decode of pc2", lambda: other.finished("pc2"))
        ep.run_until("prefill blocks back after pc2", lambda: ep.free_blocks() == total)
    finally:
        other.close()


def release(cluster: Cluster, ep: Engine, params: dict[str, Any], total: int) -> None:
    """Ends the hold (as its lease expiring or a release would) and waits for the blocks to come back."""
    cluster.api.request_sync(
        "hold.release", pb.HoldRef(transfer_id=params["transfer_id"], requester="test"), pb.HoldStatus, 5.0
    )
    ep.run_until("blocks back after the release", lambda: ep.free_blocks() == total)


def test_hold_gone_policy_fail(cluster: Cluster, engines: dict[str, Engine]) -> None:
    ep, ed = engines["prefill"], engines["fail"]
    total, dtotal = ep.free_blocks(), ed.free_blocks()
    params = prefill(ep, "r3")
    release(cluster, ep, params, total)
    ed.add("r3", PROMPT, 4, params)
    out = ed.run_until("failed load of r3", lambda: ed.finished("r3"))
    assert str(out.finish_reason).lower().endswith("error"), out.finish_reason
    assert out.new_token_ids == []
    assert "released" in ed.worker.connector_worker.done.failures["r3"]  # type: ignore[union-attr]
    assert ed.free_blocks() == dtotal


def test_hold_gone_policy_recompute(cluster: Cluster, engines: dict[str, Engine]) -> None:
    ep, ed = engines["prefill"], engines["recompute"]
    total = ep.free_blocks()
    params = prefill(ep, "r4")
    release(cluster, ep, params, total)
    ed.add("r4", PROMPT, 2, params)
    req = ed.sched.requests["r4"]
    assert ed.step() and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    so = ed.step_until_scheduled("r4")
    assert so.num_scheduled_tokens.get("r4") == len(PROMPT), "recompute prefills the whole prompt locally"
    assert ed.kv_bytes("r4", range(len(PROMPT))) == ep.expected_kv(PROMPT, range(len(PROMPT)))
    out = ed.run_until("recomputed r4", lambda: ed.finished("r4"))
    assert str(out.finish_reason).lower().endswith("length"), out.finish_reason
    assert "released" in ed.worker.connector_worker.done.failures["r4"]  # type: ignore[union-attr]


def test_limits_block_size_mismatch_fails_the_load(cluster: Cluster, engines: dict[str, Engine]) -> None:
    ep, ed = engines["prefill"], engines["fail"]
    total = ep.free_blocks()
    params = prefill(ep, "r5")
    bad = dict(params, block_size=BLOCK_SIZE * 2)
    ed.add("r5", PROMPT, 2, bad)
    out = ed.run_until("refused load of r5", lambda: ed.finished("r5"))
    assert str(out.finish_reason).lower().endswith("error")
    assert "block_size" in ed.worker.connector_worker.done.failures["r5"]  # type: ignore[union-attr]
    release(cluster, ep, params, total)


def test_unknown_setting_stops_the_engine_at_start(cluster: Cluster) -> None:
    with pytest.raises(SettingsError, match="retian_s"):
        Engine("kv_consumer", cluster.decode1.member, cluster.nats_url, "eng-bad", extra={"retian_s": 5})


def test_may_load_async_names_requests_with_a_hold(cluster: Cluster, engines: dict[str, Engine]) -> None:
    """vLLM 0.34's --max-num-inflight-kv-loads asks before scheduling: a decode request whose params name a hold may
    load asynchronously; one without (or on the prefill side) may not."""
    ed, ep = engines["fail"], engines["prefill"]
    with_hold = ed.add("mla1", PROMPT, 1, {"do_remote_prefill": True, "remote_num_tokens": len(PROMPT)})
    without = ed.add("mla2", PROMPT, 1, None)
    bad = ed.add("mla3", PROMPT, 1, {"do_remote_prefill": True, "remote_num_tokens": True})
    assert ed.conn.may_load_async(with_hold)
    assert not ed.conn.may_load_async(without) and not ed.conn.may_load_async(bad)
    assert not ep.conn.may_load_async(with_hold)
    for r in ("mla1", "mla2", "mla3"):
        ed.sched.finish_requests(r, RequestStatus.FINISHED_ABORTED)


def test_kv_cache_access_leaves_vllm_allocation_alone() -> None:
    """vLLM 0.34 asks a connector how its workers reach the KV cache: the connector rebinds the tensors onto a connexd
    region itself, so vLLM's allocation needs nothing (REGISTERS would make it allocate every segment in one piece)."""
    kv_transfer = pytest.importorskip("vllm.config.kv_transfer")
    if not hasattr(kv_transfer, "KVCacheAccess"):
        pytest.skip("this vLLM (before 0.34) does not ask")
    from connex_vllm.connector import ConnexConnector

    access = ConnexConnector.kv_cache_access(None)
    assert access == kv_transfer.KVCacheAccess.IN_PROCESS and not access.needs_single_chunk()


def test_refused_start_fails_its_load(cluster: Cluster, engines: dict[str, Engine]) -> None:
    """The load goes to the worker beside request.start (await_start): when connexd refuses the start, it refuses the
    pull with the start's error, and vLLM's kv_load_failure_policy applies as for any failed load."""
    ep, ed = engines["prefill"], engines["fail"]
    total, dtotal = ep.free_blocks(), ed.free_blocks()
    params = prefill(ep, "r6")
    # A takeover of a request connexd never stored: request.start is refused.
    bad = dict(params, connex_resume=True, connex_request_id="never-started-r6")
    ed.add("r6", PROMPT, 2, bad)
    out = ed.run_until("failed load of r6", lambda: ed.finished("r6"))
    assert str(out.finish_reason).lower().endswith("error"), out.finish_reason
    why = ed.worker.connector_worker.done.failures["r6"]  # type: ignore[union-attr]
    assert "its request.start failed" in why, why
    assert ed.free_blocks() == dtotal
    release(cluster, ep, params, total)


def test_unanswered_hold_create_costs_one_deadline_not_one_a_request(cluster: Cluster) -> None:
    """A prefill engine whose connexd froze (SIGSTOP) pays call_timeout_s once, not once per finishing request: the
    next ones get no hold at once (blocks freed, no kv_transfer_params: the router prefills elsewhere), until
    connexd answers the registration renewal again; then holds are made again."""
    frozen = Connexd("pre-frozen", "prefill", cluster.nats_url)
    ep = Engine("kv_producer", frozen.member, cluster.nats_url, "eng-pre-frozen", extra={"call_timeout_s": 0.5})
    cs = ep.connector_sched
    try:
        prefill(ep, "f1")
        total = ep.free_blocks()
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            batch = ("f2", "f3", "f4")
            for rid in batch:
                ep.add(rid, PROMPT, 1, {"do_remote_decode": True, "do_remote_prefill": False})
            ep.run_until("the batch's prefills", lambda: all(ep.finished(r) for r in batch))
            # One call went unanswered; the two requests after it were refused without a call.
            assert cs.stats.holds_unanswered == 1, cs.stats
            assert cs.stats.hold_errors == 3 and cs.holds_breaker.refused == 2, cs.stats
            assert all(not ep.finished(r).kv_transfer_params for r in batch)
            assert ep.free_blocks() == total, "the refused requests' blocks must go back to vLLM"
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        wait_for("connexd answering again", lambda: not cs.holds_breaker.is_open(), timeout_s=15.0)
        prefill(ep, "f5")
        assert cs.stats.holds_created == 2
    finally:
        ep.close()
        frozen.kill()
