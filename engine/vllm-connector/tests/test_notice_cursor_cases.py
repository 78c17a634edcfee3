"""NoticeCursor against the cases the Go shim's noticeCursor runs too (engine/shim/noticecursor_test.go)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connex_vllm.notices import NoticeCursor

CASES = Path(__file__).resolve().parents[3] / "engine/shim/testdata/notice_cursor_cases.json"


def load() -> list[dict[str, Any]]:
    return json.loads(CASES.read_text())


def test_there_are_enough_cases() -> None:
    assert len(load()) >= 10


@pytest.mark.parametrize("case", load(), ids=lambda c: c["name"])
def test_notice_cursor_case(case: dict[str, Any]) -> None:
    c = NoticeCursor()
    c.reset(*case["start"])
    why = case["why"]
    for i, step in enumerate(case["steps"]):
        if "live" in step:
            call = f"live{tuple(step['live'])}"
            got = c.live(*step["live"]).value
            assert got == step["verdict"], f"step {i}: {call} = {got}, want {step['verdict']} ({why})"
        elif "seen" in step:
            call = f"seen{tuple(step['seen'])}"
            ok = c.seen(*step["seen"])
            assert ok is step["ok"], f"step {i}: {call} = {ok}, want {step['ok']} ({why})"
        elif "reset" in step:
            call = f"reset{tuple(step['reset'])}"
            c.reset(*step["reset"])
        else:
            raise AssertionError(f"step {i}: none of live, seen, reset")
        want = tuple(step["position"])
        assert c.position() == want, f"step {i}: after {call} the position is {c.position()}, want {want} ({why})"
