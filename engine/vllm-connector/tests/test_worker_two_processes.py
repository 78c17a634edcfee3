"""Worker level: real torch KV tensors written by a prefill engine in one OS process arrive byte-identical in
the decode engine's KV cache tensors in another, through connexd regions and a pull."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from conftest import Cluster
from engine import Engine
from vllm.v1.request import RequestStatus


def test_kv_tensors_byte_identical_across_processes(cluster: Cluster, tmp_path: Path) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "prefill_process.py"),
            cluster.prefill.member,
            cluster.nats_url,
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until the prefill process answers or exits
        assert line.startswith("PARAMS "), f"prefill process said {line!r} (exit {child.poll()})"
        params = json.loads(line.removeprefix("PARAMS "))
        saved = torch.load(tmp_path / "prefill_kv.pt")
        prompt: list[int] = saved["prompt"]
        want: torch.Tensor = saved["kv"]
        assert want.abs().sum() > 0, "the prefill process wrote no KV"

        ed = Engine("kv_consumer", cluster.decode1.member, cluster.nats_url, "eng-wk-dec")
        try:
            ed.add("w1", prompt, 2, dict(params, connex_request_id="conn-w1"))
            req = ed.sched.requests["w1"]
            ed.run_until("load", lambda: req.status == RequestStatus.RUNNING)
            got = ed.kv_slots("w1", range(len(prompt) - 1))  # the last prompt token vLLM recomputes itself
            assert torch.equal(got.view(torch.uint8), want[:, :, : len(prompt) - 1].contiguous().view(torch.uint8))
            ed.run_until("decode", lambda: ed.finished("w1"))
        finally:
            ed.close()
        assert child.stdout.readline().strip() == "BLOCKS-BACK"
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
