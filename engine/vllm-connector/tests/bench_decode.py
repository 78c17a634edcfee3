"""Benchmark: the connector's own overhead per request on the decode side, beside the pull time.

Run: ``.venv-vllm/bin/python engine/vllm-connector/tests/bench_decode.py [--requests N] [--tokens T]``
(run-tests.sh --bench).
It starts a prefill and a decode connexd and a vLLM Scheduler with ConnexConnector beside each, then, one
request at a time: prefill (not measured), decode with the KV loaded from the hold, finish. Per request it sums
the time spent inside every connector hook on the decode engine's step loop (scheduler and worker roles), and
reports the subject-API round trips the connector makes for it (request.start, pull.start, request.finish; on
the bus thread, off the step loop) beside the pull's own duration (connexd's PullDone.duration_us: the bytes'
copy) and the wall time from start_load_kv to the get_finished that reported the load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from cluster import Connexd
from engine import BLOCK_SIZE, Engine

SCHED_HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished")
WORKER_HOOKS = (
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_save",
    "get_finished",
    "get_block_ids_with_load_errors",
    "clear_connector_metadata",
)


calls: dict[str, int] = defaultdict(int)


def timed(obj: Any, name: str, acc: dict[str, float], cpu: dict[str, float]) -> None:
    f = getattr(obj, name)

    def wrapper(*a: Any, **k: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t0
            cpu[name] += time.thread_time() - c0
            calls[name] += 1

    setattr(obj, name, wrapper)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=512, help="prompt tokens per request")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=4)
    a = ap.parse_args()
    p = Connexd("bench-pre", "prefill", None)
    d = Connexd("bench-dec", "decode", p.nats_url)
    nblocks = (a.tokens + BLOCK_SIZE - 1) // BLOCK_SIZE + 8
    geo = {"layers": a.layers, "heads": a.heads, "head_size": a.head_size, "num_blocks": nblocks}
    ep = Engine("kv_producer", p.member, p.nats_url, "bench-eng-pre", **geo)  # type: ignore[arg-type]
    ed = Engine("kv_consumer", d.member, p.nats_url, "bench-eng-dec", **geo)  # type: ignore[arg-type]
    try:
        hooks: dict[str, float] = defaultdict(float)
        cpu: dict[str, float] = defaultdict(float)
        for h in SCHED_HOOKS:
            timed(ed.conn, h, hooks, cpu)
        for h in WORKER_HOOKS:
            timed(ed.worker, h, hooks, cpu)
        load_t0: dict[str, float] = {}
        load_wall: dict[str, float] = {}
        w = ed.worker
        start, finished = w.start_load_kv, w.get_finished

        def start_load_kv(*args: Any, **kw: Any) -> None:
            for spec in w._get_connector_metadata().loads:  # type: ignore[attr-defined]
                load_t0[spec.req_id] = time.perf_counter()
            start(*args, **kw)

        def get_finished(*args: Any, **kw: Any) -> Any:
            out = finished(*args, **kw)
            for rid in out[1] or ():
                load_wall[rid] = time.perf_counter() - load_t0.pop(rid)
            return out

        w.start_load_kv, w.get_finished = start_load_kv, get_finished  # type: ignore[method-assign]
        rtts: dict[str, list[float]] = defaultdict(list)
        cur: dict[str, float] = defaultdict(float)

        def on_call(ep_name: str, s: float) -> None:
            cur[ep_name] += s

        ed.connector_sched._bus.on_call = on_call
        ed.worker.connector_worker.bus.on_call = on_call  # type: ignore[union-attr]
        per_req_hooks: list[float] = []
        per_req_cpu: list[float] = []
        per_req_calls: list[int] = []
        by_hook: dict[str, list[float]] = defaultdict(list)
        pulls: list[float] = []
        walls: list[float] = []
        prompt = [(i * 7 + 3) % 1000 + 3 for i in range(a.tokens)]
        block_bytes = BLOCK_SIZE * a.heads * a.head_size * 2
        kv_bytes = 2 * a.layers * ((a.tokens + BLOCK_SIZE - 1) // BLOCK_SIZE) * block_bytes
        for i in range(a.requests + 2):  # two warm-up requests
            rid = f"b{i}"
            ep.add(rid, prompt, 1, {"do_remote_decode": True})
            params = ep.run_until("prefill", lambda rid=rid: ep.finished(rid)).kv_transfer_params
            hooks.clear()
            cpu.clear()
            calls.clear()
            cur.clear()
            ed.add(rid, prompt, a.max_tokens, dict(params, connex_request_id=f"bench-{rid}"))
            ed.run_until("decode", lambda rid=rid: ed.finished(rid))
            assert ed.connector_sched.drain(10.0), "request calls did not end"
            if i < 2:
                continue
            per_req_hooks.append(sum(hooks.values()))
            per_req_calls.append(sum(calls.values()))
            per_req_cpu.append(sum(cpu.values()))
            for k, v in hooks.items():
                by_hook[k].append(v)
            for k, v in cur.items():
                rtts[k].append(v)
            pulls.append(ed.worker.connector_worker.done.pull_us[rid] / 1e6)  # type: ignore[union-attr]
            walls.append(load_wall[rid])
            ep.run_until("blocks back", lambda: ep.connector_sched.holds_outstanding() == 0)
        us = 1e6
        rtt_total = [
            sum(x) for x in zip(*(rtts[k] for k in ("request.start", "pull.start", "request.finish")), strict=True)
        ]
        print(
            f"BENCH connector-decode requests={a.requests} prompt_tokens={a.tokens} kv_bytes={kv_bytes} "
            f"steps_per_request={a.max_tokens + 1}+"
        )
        print(
            f"BENCH overhead-per-request hooks_us p50={statistics.median(per_req_hooks) * us:.0f} "
            f"p90={pct(per_req_hooks, 0.9) * us:.0f} cpu_us p50={statistics.median(per_req_cpu) * us:.0f} "
            f"hook_calls p50={statistics.median(per_req_calls):.0f} "
            "(every connector hook on the decode step loop, both roles; wall includes waits for the GIL)"
        )
        print("BENCH hooks_us p50 " + " ".join(f"{k}={statistics.median(v) * us:.0f}" for k, v in by_hook.items()))
        for k in ("request.start", "pull.start", "request.finish"):
            print(
                f"BENCH nats-rtt {k} p50_us={statistics.median(rtts[k]) * us:.0f} p90_us={pct(rtts[k], 0.9) * us:.0f}"
            )
        both = [h + r for h, r in zip(per_req_hooks, rtt_total, strict=True)]
        print(
            f"BENCH overhead-per-request hooks+nats_us p50={statistics.median(both) * us:.0f} "
            f"beside pull_us p50={statistics.median(pulls) * us:.0f} p90={pct(pulls, 0.9) * us:.0f} "
            f"({kv_bytes / statistics.median(pulls) / 1e9:.2f} GB/s) "
            f"load_wall_us p50={statistics.median(walls) * us:.0f}"
        )
    finally:
        ed.close()
        ep.close()
        d.stop()
        p.stop()


if __name__ == "__main__":
    main()
