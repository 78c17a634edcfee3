"""KV cache groups (vLLM's hybrid KV cache manager): which blocks of each group a hold keeps and a load fills.

A model with full-attention and sliding-window layers has one KV cache group per kind (or several of one kind);
each group has its own block table over one shared block pool, so a block id names one group's block. A
sliding-window group keeps only the blocks its window still reads: vLLM replaces the ones before it with the null
block (id 0), before the connector sees the request finish on the prefill side and when it allocates a load on
the decode side. Both sides compute that boundary from the same token count, so the prefill's real blocks of a
group and the decode's blocks to fill line up one to one, position by position.

A hold is the flat list of every group's real blocks, group after group; ``group_blocks`` in kv_transfer_params
says how many belong to each. connexd moves blocks whole (block i of the hold into block i of the load), so a
hybrid model's KV moves between engines of one block size and TP size. Pure functions only: the scheduler half
calls them with vLLM's block tables.
"""

from __future__ import annotations

from collections.abc import Sequence

#: vLLM's null block: a position whose KV no one reads (before a sliding window) or that is not allocated.
NULL_BLOCK = 0


class GroupError(ValueError):
    """A block table that is not what a hold or a load of a hybrid model expects (vLLM changed its rules)."""


def real_blocks(table: Sequence[int], first: int, count: int) -> list[int]:
    """The real blocks of one group's table at positions [first, first + count): its leading null blocks (the
    positions a sliding window no longer reads) left out. A null block after a real one, or a table shorter than
    first + count, raises GroupError."""
    if first < 0 or count < 0 or len(table) < first + count:
        raise GroupError(f"a block table of {len(table)} blocks has no positions {first}..{first + count - 1}")
    window = list(table[first : first + count])
    lead = 0
    while lead < len(window) and window[lead] == NULL_BLOCK:
        lead += 1
    if NULL_BLOCK in window[lead:]:
        raise GroupError(f"block table {window}: a null block after a real one (only a window's start may be null)")
    return window[lead:]


def hold_blocks(tables: Sequence[Sequence[int]], nblocks: int) -> tuple[list[int], list[int]]:
    """(flat block ids, blocks per group) of a hold over the first nblocks positions of every group's table."""
    flat: list[int] = []
    counts: list[int] = []
    for table in tables:
        blocks = real_blocks(table, 0, nblocks)
        if not blocks:
            raise GroupError(f"a group holds no block of the request's first {nblocks} positions")
        flat.extend(blocks)
        counts.append(len(blocks))
    return flat, counts


def load_blocks(
    tables: Sequence[Sequence[int]], first: int, nblocks: int, hold_counts: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(flat destination, blocks of each group's hold left out) of a load: every group's real blocks at positions
    [first, first + nblocks) — past a local prefix-cache hit of first blocks — paired one to one with the last ones
    of the hold's blocks of that group (hold_counts, as ``hold_blocks`` made them; both end at the request's last
    block). Raises GroupError when the groups differ or a group fills more blocks than the hold has (another model,
    or another window)."""
    if len(tables) != len(hold_counts):
        raise GroupError(f"the hold has {len(hold_counts)} KV cache groups, this engine {len(tables)}")
    flat: list[int] = []
    skips: list[int] = []
    for g, (table, have) in enumerate(zip(tables, hold_counts, strict=True)):
        blocks = real_blocks(table, first, nblocks)
        if len(blocks) > have or (first == 0 and len(blocks) != have):
            raise GroupError(f"group {g}: the hold has {have} blocks, this engine fills {len(blocks)}")
        flat.extend(blocks)
        skips.append(have - len(blocks))
    return flat, skips


def window_edge(num_tokens: int, windows: Sequence[int], block_size: int) -> bool:
    """Whether a load of a whole prompt of num_tokens tokens would leave the last prompt token without a key it
    reads: vLLM recomputes that token (position num_tokens - 1) after the load, and a sliding window of W tokens
    reads keys from position num_tokens - W; but both sides drop the blocks before position num_tokens - W + 1,
    which, when that is a multiple of block_size, include the block holding key num_tokens - W. The prefill engine
    freed it before the hold was made: such a request is computed where it decodes instead (windows: each group's
    sliding window, 0 for full attention)."""
    for w in windows:
        first_kept = num_tokens - w + 1
        if w > 0 and first_kept > 0 and first_kept % block_size == 0:
            return True
    return False
