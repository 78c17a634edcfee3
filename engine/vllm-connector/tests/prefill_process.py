"""The prefill engine of test_worker_two_processes, in its own OS process.

argv: member nats_url out_dir. Prefills one request whose 'model' writes random bf16 KV, saves the request's
KV slots (as its attention layers see them) to out_dir/prefill_kv.pt, prints ``PARAMS <json>``, then keeps
stepping until the hold's blocks are back in its pool and prints ``BLOCKS-BACK``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from engine import DTYPE, HEAD_SIZE, NUM_KV_HEADS, Engine

PROMPT = [(i * 13 + 5) % 1000 + 3 for i in range(50)]


def main() -> None:
    member, url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    gen = torch.Generator().manual_seed(1234)

    def random_kv(token: int, pos: int, layer: int, plane: int) -> torch.Tensor:
        return torch.randn(NUM_KV_HEADS, HEAD_SIZE, generator=gen, dtype=torch.float32).to(DTYPE)

    ep = Engine("kv_producer", member, url, "eng-wk-pre", kv_fn=random_kv)
    total = ep.free_blocks()
    ep.add("w1", PROMPT, 1, {"do_remote_decode": True})
    params = ep.run_until("prefill", lambda: ep.finished("w1")).kv_transfer_params
    torch.save({"prompt": PROMPT, "kv": ep.kv_slots("w1", range(len(PROMPT)))}, out / "prefill_kv.pt")
    print("PARAMS " + json.dumps(params), flush=True)
    ep.run_until("blocks back", lambda: ep.free_blocks() == total, timeout_s=60.0)
    print("BLOCKS-BACK", flush=True)
    ep.close()


if __name__ == "__main__":
    main()
