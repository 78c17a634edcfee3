"""connex_vllm.groups: a hybrid model's hold and load, from the block tables vLLM 0.32 hands the connector (the
cases below are tables a real vllm serve of a sliding-window model produced: block size 32, window 32)."""

from __future__ import annotations

import pytest

from connex_vllm.groups import GroupError, hold_blocks, load_blocks, real_blocks, window_edge


def test_a_hold_keeps_each_group_s_real_blocks() -> None:
    # (sliding, full) at the prefill's finish: the window's blocks before it are null.
    assert hold_blocks(([0, 0, 0, 4], [5, 6, 7, 8]), 4) == ([4, 5, 6, 7, 8], [1, 4])
    assert hold_blocks(([0, 0, 0, 5, 4], [3, 2, 1, 9, 10]), 5) == ([5, 4, 3, 2, 1, 9, 10], [2, 5])
    # Positions past the request's tokens are not held.
    assert hold_blocks(([0, 7, 8, 9], [1, 2, 3, 4]), 3) == ([7, 8, 1, 2, 3], [2, 3])


def test_a_load_pairs_each_group_with_the_hold_s() -> None:
    # The decode engine's allocation for the same tokens: its null positions are the prefill's.
    assert load_blocks(([0, 0, 0, 10], [9, 1, 2, 3]), 0, 4, [1, 4]) == ([10, 9, 1, 2, 3], [0, 0])
    assert load_blocks(([0, 0, 0, 5, 3], [2, 1, 9, 4, 10]), 0, 5, [2, 5]) == ([5, 3, 2, 1, 9, 4, 10], [0, 0])


def test_a_load_past_a_local_hit_skips_what_each_group_has() -> None:
    # 2 blocks cached locally: the full group loads from its third block; the sliding group's window starts past
    # the hit, so it loads all the hold has of it.
    assert load_blocks(([0, 0, 0, 10], [9, 1, 2, 3]), 2, 2, [1, 4]) == ([10, 2, 3], [0, 2])
    # 4 of 5 blocks cached: the hit reaches into the window, whose first block is cached too.
    assert load_blocks(([0, 0, 0, 5, 3], [2, 1, 9, 4, 10]), 4, 1, [2, 5]) == ([3, 10], [1, 4])


def test_tables_that_do_not_line_up_are_refused() -> None:
    with pytest.raises(GroupError, match="group 0: the hold has 2 blocks, this engine fills 1"):
        load_blocks(([0, 0, 0, 10], [9, 1, 2, 3]), 0, 4, [2, 4])  # another window
    with pytest.raises(GroupError, match="2 KV cache groups, this engine 1"):
        load_blocks(([1, 2],), 0, 2, [1, 2])
    with pytest.raises(GroupError, match="null block after a real one"):
        real_blocks([0, 3, 0, 4], 0, 4)
    with pytest.raises(GroupError, match="no positions"):
        real_blocks([1, 2], 1, 2)
    with pytest.raises(GroupError, match="holds no block"):
        hold_blocks(([0, 0], [1, 2]), 2)


def test_the_window_edge() -> None:
    # 127 tokens, window 32, blocks of 32: the blocks before position 96 are dropped, and the last prompt token
    # (126) reads key 95.
    assert window_edge(127, (32, 0), 32)
    assert not window_edge(128, (32, 0), 32) and not window_edge(126, (32, 0), 32)
    assert not window_edge(127, (0, 0), 32)  # full attention keeps every block
    assert not window_edge(20, (32,), 32)  # the window reaches back past the prompt's start
    assert window_edge(191, (64, 0), 128) and not window_edge(192, (64, 0), 128)
