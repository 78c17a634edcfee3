"""Fixtures: one prefill and two decode connexd processes, and a vLLM engine (real Scheduler) beside each."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cluster import Connexd, admin_creds

from connex_vllm.bus import Bus


@dataclass
class Cluster:
    prefill: Connexd
    decode1: Connexd
    decode2: Connexd
    nats_url: str
    api: Bus  # a test client on the cluster's NATS (member: the prefill connexd)

    def on(self, member: str) -> Bus:
        return Bus(self.nats_url, member, f"test-{member}", 5.0, creds=admin_creds(self.nats_url))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    p = Connexd("pre-0", "prefill", None)
    procs = [p]
    try:
        d1 = Connexd("dec-1", "decode", p.nats_url)
        procs.append(d1)
        d2 = Connexd("dec-2", "decode", p.nats_url)
        procs.append(d2)
        api = Bus(p.nats_url, p.member, "test-api", 5.0, creds=admin_creds(p.nats_url))
        yield Cluster(p, d1, d2, p.nats_url, api)
        api.close()
    finally:
        for c in reversed(procs):
            c.stop()
