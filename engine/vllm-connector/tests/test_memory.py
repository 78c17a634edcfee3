"""The KV memory seam without vLLM: layout derivation from the tensors, and every view the model reads rebound
onto connexd's region (a temporary file stands in for the region connexd creates)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from cluster import wait_for

from connex_vllm.memory import HandoverError, LayoutError, SharedRegionMemory, geometry, rank_heads
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


def test_a_described_layout_says_what_a_block_holds() -> None:
    # The CPU order only where the kernel's order is known (cpuorder.known); the GPU's NHD from its shape.
    cpu = geometry(cpu_caches(), BLOCK_SIZE, BLOCKS, cpu_order=True).layout(1)
    assert (cpu.kv_order, cpu.num_kv_heads, cpu.head_size, cpu.dtype) == ("cpu", HEADS, HEAD, "float32")
    gpu = geometry({"l0": torch.zeros(2, BLOCKS, BLOCK_SIZE, HEADS, HEAD, dtype=torch.bfloat16)}, BLOCK_SIZE, BLOCKS)
    assert (gpu.layout(1).kv_order, gpu.layout(1).num_kv_heads, gpu.layout(1).dtype) == ("nhd", HEADS, "bfloat16")
    # connexd's rule: block_bytes = heads x head_size x element bytes x block_size (x 2 with one plane).
    assert cpu.block_bytes == cpu.num_kv_heads * cpu.head_size * 4 * cpu.block_size * 2


def test_a_rank_describes_its_share_of_the_model_s_heads() -> None:
    # At TP > 1 a rank's tensors hold its share; the layout names the model's heads and the rank (connexd's
    # HeadRange finds the share from them).
    g = geometry(cpu_caches(), BLOCK_SIZE, BLOCKS, cpu_order=True)  # HEADS heads in this rank's tensors
    for tp, rank in [(2, 1), (4, 3)]:
        lay = g.layout(tp, rank, HEADS * tp)
        assert (lay.tp_size, lay.tp_rank, lay.kv_order, lay.num_kv_heads) == (tp, rank, "cpu", HEADS * tp)
    # Fewer heads than ranks: one head replicated on several ranks (this rank's tensors must hold exactly one).
    one = geometry({"l0": torch.zeros(BLOCKS, 1, BLOCK_SIZE, 2 * HEAD)}, BLOCK_SIZE, BLOCKS, cpu_order=True)
    assert one.layout(4, 3, 2).num_kv_heads == 2
    assert (rank_heads(2, 4), rank_heads(8, 2), rank_heads(8, 1)) == (1, 4, 8)


def test_a_layout_not_known_is_left_undescribed() -> None:
    # The CPU kernel's order not known, TP > 1 without the model's heads (or heads that do not split into this
    # rank's tensors), or an element type connexd does not name: blocks move whole only.
    assert geometry(cpu_caches(), BLOCK_SIZE, BLOCKS).layout(1).kv_order == ""
    g = geometry(cpu_caches(), BLOCK_SIZE, BLOCKS, cpu_order=True)
    assert g.layout(2).kv_order == ""
    assert g.layout(2, 1, HEADS).kv_order == ""  # HEADS over 2 ranks is not the HEADS this rank holds
    assert g.layout(2, 1).tp_rank == 1  # undescribed, still the rank's
    odd = {"l0": torch.zeros(2, BLOCKS, BLOCK_SIZE, HEADS, HEAD, dtype=torch.complex64)}
    assert geometry(odd, BLOCK_SIZE, BLOCKS).layout(1).kv_order == ""
    # A block dimension that is not the block size says nothing either.
    assert geometry(cpu_caches(), BLOCK_SIZE * 2, BLOCKS, cpu_order=True).layout(1).kv_order == ""


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


# connexd's region socket, played by a thread speaking its protocol: one SOCK_SEQPACKET message each way.
Answer = Callable[[bytes, int], tuple[bytes, list[int]]]  # (request, region fd) -> (answer, fds to send)


@pytest.fixture
def region_socket(tmp_path: Path) -> Iterator[tuple[str, list[bytes], list[Answer]]]:
    path = str(tmp_path / "region.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(4)
    seen: list[bytes] = []
    answers: list[Answer] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                req = conn.recv(4096)
                seen.append(req)
                fd = os.open(tmp_path / "region", os.O_RDWR)
                try:
                    msg, fds = answers.pop(0)(req, fd)
                    socket.send_fds(conn, [msg], fds) if fds else conn.send(msg)
                finally:
                    os.close(fd)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, seen, answers
    srv.close()
    t.join(5)


def handed_over(tmp_path: Path, sock: str) -> SharedRegionMemory:
    mem, _ = region(tmp_path)
    plain = mem.create  # type: ignore[attr-defined]

    def create(layout: pb.Layout) -> pb.RegionInfo:
        info = plain(layout)
        # /proc/<connexd pid>/fd/<n> in real life: must not be opened when a socket is named.
        info.path = "/nonexistent/proc-path"
        info.engine_id, info.handover_socket, info.handover_token = "eng", sock, "0123abcd" * 4
        return info

    mem.create = create  # type: ignore[attr-defined]
    return mem


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_region_received_over_the_region_socket(tmp_path: Path, region_socket: tuple) -> None:
    sock, seen, answers = region_socket
    answers.append(lambda req, fd: (b"OK", [fd]))
    caches = cpu_caches()
    mem = handed_over(tmp_path, sock)
    mem.attach(caches, mem.create)  # type: ignore[attr-defined]
    assert seen == [b"CONNEX-REGION/1 eng r0 " + b"0123abcd" * 4]
    caches["l0"][2].fill_(5.0)  # the model's write lands in the region connexd handed over
    g = mem.geometry
    raw = (tmp_path / "region").read_bytes()[2 * g.block_bytes : 3 * g.block_bytes]
    assert bool((torch.frombuffer(bytearray(raw), dtype=torch.float32) == 5.0).all())


def test_region_socket_refusal_is_clear_and_leaks_nothing(tmp_path: Path, region_socket: tuple) -> None:
    sock, _, answers = region_socket
    answers.append(lambda req, fd: (b"ERR handover: refused: no valid token for engine eng region r0", []))
    answers.append(lambda req, fd: (b"OK", [fd, fd]))  # more than the one descriptor: all closed, refused
    answers.append(lambda req, fd: (b"OK", []))
    before = open_fds()
    for addr, says in (
        (sock, "refused region r0: handover: refused: no valid token"),
        (sock, "with 2 descriptors"),
        (sock, "with 0 descriptors"),
        ("@connex-nobody-listens", "region socket @connex-nobody-listens"),
    ):
        mem = handed_over(tmp_path, addr)
        with pytest.raises(HandoverError, match=says):
            mem.attach(cpu_caches(), mem.create)  # type: ignore[attr-defined]
    # The fixture's server thread closes its side after answering: wait for it, then count.
    wait_for("every descriptor closed", lambda: open_fds() == before or None, timeout_s=5.0)


def test_layers_on_the_same_bytes_are_one_region_layer() -> None:
    # vLLM's hybrid manager puts layer k of every KV cache group on the same bytes: layers 0 and 1 share a
    # slice, and so do 2 and 3, of one buffer.
    buf = torch.zeros(2, BLOCKS, HEADS, BLOCK_SIZE, 2 * HEAD)
    caches = {"l0": buf[0], "l1": buf[0].view(buf[0].shape), "l2": buf[1], "l3": buf[1].view(buf[1].shape)}
    g = geometry(caches, BLOCK_SIZE, BLOCKS, cpu_order=True)
    assert g.layer_names == ("l0", "l2")
    assert g.bytes == 2 * g.layer_bytes
