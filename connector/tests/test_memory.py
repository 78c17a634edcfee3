"""The KV memory seam without vLLM: layout derivation from the tensors, and every view the model reads rebound
onto connexd's region (a temporary file stands in for the region connexd creates)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from connex_vllm.memory import LayoutError, SharedRegionMemory, geometry
from connex_vllm.pb import connex_pb2 as pb

BLOCKS, HEADS, BLOCK_SIZE, HEAD = 6, 2, 16, 8


def cpu_caches(layers: int = 2) -> dict[str, torch.Tensor]:
    """vLLM's CPU layout: one allocation, a [blocks, kv_heads, block_size, 2*head] view per layer."""
    per = BLOCKS * HEADS * BLOCK_SIZE * 2 * HEAD
    buf = torch.zeros(layers * per, dtype=torch.float32)
    return {f"l{i}": buf[i * per : (i + 1) * per].view(BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD) for i in range(layers)}


def test_geometry_of_the_cpu_layout_is_one_plane() -> None:
    g = geometry(cpu_caches(), BLOCK_SIZE, BLOCKS)
    assert (g.planes, g.num_blocks, g.block_bytes) == (1, BLOCKS, HEADS * BLOCK_SIZE * 2 * HEAD * 4)
    assert g.layout(1).kv_planes == 1 and g.bytes == 2 * BLOCKS * g.block_bytes


def test_geometry_of_the_gpu_layout_is_two_planes() -> None:
    caches = {"l0": torch.zeros(2, BLOCKS, BLOCK_SIZE, HEADS, HEAD)}
    g = geometry(caches, BLOCK_SIZE, BLOCKS)
    assert (g.planes, g.num_blocks, g.block_bytes) == (2, BLOCKS, BLOCK_SIZE * HEADS * HEAD * 4)


def test_geometry_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(LayoutError, match="shape"):
        geometry({"l0": torch.zeros(3, 4, 5)}, BLOCK_SIZE, BLOCKS)  # no dimension holds the blocks
    with pytest.raises(LayoutError, match="not contiguous"):
        geometry({"l0": torch.zeros(HEADS, BLOCKS, BLOCK_SIZE).transpose(0, 1)}, BLOCK_SIZE, BLOCKS)
    with pytest.raises(LayoutError, match="one geometry"):
        geometry({"a": torch.zeros(BLOCKS, 4), "b": torch.zeros(BLOCKS, 8)}, BLOCK_SIZE, BLOCKS)


def region(tmp_path: Path) -> tuple[SharedRegionMemory, list[pb.Layout]]:
    mem = SharedRegionMemory(1, BLOCK_SIZE, BLOCKS)
    asked: list[pb.Layout] = []

    def create(layout: pb.Layout) -> pb.RegionInfo:
        asked.append(layout)
        path = tmp_path / "region"
        size = layout.num_layers * layout.kv_planes * layout.num_blocks * layout.block_bytes
        with open(path, "wb") as f:
            f.truncate(size)
        return pb.RegionInfo(region_id="r0", path=str(path), bytes=size)

    mem.create = create  # type: ignore[attr-defined]
    return mem, asked


def test_layer_views_are_rebound_onto_the_region(tmp_path: Path) -> None:
    caches = cpu_caches()
    # What vLLM binds to the attention layers: a view of each manager tensor (a kernel-block view).
    views = [t.view(BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD)[:, :, :, :] for t in caches.values()]
    mem, asked = region(tmp_path)
    mem.attach(caches, mem.create, views)  # type: ignore[attr-defined]
    assert asked[0].kv_planes == 1
    # The model writes through its view; connexd's region (the file) has the bytes, at the layout's offset.
    views[1][3].fill_(7.0)
    g = mem.geometry
    raw = (tmp_path / "region").read_bytes()
    at = g.layer_bytes + 3 * g.block_bytes
    got = torch.frombuffer(bytearray(raw[at : at + g.block_bytes]), dtype=torch.float32)
    assert bool((got == 7.0).all())
    assert bool((caches["l1"][3] == 7.0).all())  # the manager tensor sees it too
    assert os.path.getsize(tmp_path / "region") == g.bytes


def test_a_view_outside_the_registered_tensors_is_refused(tmp_path: Path) -> None:
    caches = cpu_caches()
    stray = torch.zeros(BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD)  # memory the model reads that is not the KV cache
    mem, _ = region(tmp_path)
    with pytest.raises(LayoutError, match="stale memory"):
        mem.attach(caches, mem.create, [stray])  # type: ignore[attr-defined]


def test_move_carries_the_kv_to_a_new_region_and_rebinds_every_view(tmp_path: Path) -> None:
    caches = cpu_caches()
    views = [t.view(BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD)[:, :, :, :] for t in caches.values()]
    mem, _ = region(tmp_path)
    mem.attach(caches, mem.create, views)  # type: ignore[attr-defined]
    views[0][2].fill_(3.0)  # KV a running request computed before connexd restarted
    moved = tmp_path / "moved"

    def create_again(layout: pb.Layout) -> pb.RegionInfo:  # the restarted connexd's new region
        size = layout.num_layers * layout.kv_planes * layout.num_blocks * layout.block_bytes
        with open(moved, "wb") as f:
            f.truncate(size)
        return pb.RegionInfo(region_id="r0", path=str(moved), bytes=size)

    mem.move(create_again)
    assert mem.info is not None and mem.info.path == str(moved)
    g = mem.geometry
    raw = moved.read_bytes()
    at = 2 * g.block_bytes
    got = torch.frombuffer(bytearray(raw[at : at + g.block_bytes]), dtype=torch.float32)
    assert bool((got == 3.0).all()), "the KV written before the move is in the new region"
    # From now on the model writes (through views and caches) land in the new region only.
    views[1][4].fill_(9.0)
    caches["l0"][5].fill_(5.0)
    raw = moved.read_bytes()
    for layer, block, want in ((1, 4, 9.0), (0, 5, 5.0)):
        at = layer * g.layer_bytes + block * g.block_bytes
        got = torch.frombuffer(bytearray(raw[at : at + g.block_bytes]), dtype=torch.float32)
        assert bool((got == want).all()), (layer, block)
    old = (tmp_path / "region").read_bytes()
    at = g.layer_bytes + 4 * g.block_bytes
    assert not any(old[at : at + g.block_bytes]), "nothing is written to the old region after the move"
