"""KV memory that connexd can serve: the seam between vLLM's KV cache tensors and connexd's regions.

connexd reads and writes KV blocks in a *region* it owns (``region.create``), laid out as
``((layer * planes + plane) * num_blocks + block) * block_bytes``. The layout is derived from the tensors vLLM
hands ``register_kv_caches`` (``geometry``): GPU attention backends keep one tensor per layer shaped
``(2, num_blocks, ...)`` (K/V plane first: ``planes`` 2); vLLM's CPU backend keeps ``[num_blocks, num_kv_heads,
block_size, 2 * head_size]`` (K and V inside each block: ``planes`` 1). Either way a layer's tensor is one
contiguous slice of the region, and a block is moved whole.

Backends (``KVMemory``):

- ``SharedRegionMemory`` (CPU KV caches, this version): connexd creates the region, the worker receives its
  descriptor on connexd's region socket (``receive_region_fd``: the one-use token from ``region.create``'s answer,
  SCM_RIGHTS; so the engine may run under its own uid) and maps it, and rebinds every KV cache tensor onto its slice
  with ``Tensor.set_``, and with it every view the attention layers were bound to (in place: the layers keep
  the same tensor objects). Zero copies: what the model
  writes is what connexd serves, and a pull writes straight into the decode engine's KV cache. Chosen over a
  staging copy because a copy costs a full pass over every block on both sides and puts it in the step loop.
  When connexd restarts under the engine, ``move`` makes a new region and carries the KV over (one copy, between
  two steps), rebinding the same tensors again.
- CUDA (not built yet): a backend with the same three hooks. ``attach`` would export the cache with CUDA IPC
  (or register it for GPUDirect RDMA) instead of mapping a host region; ``before_hold``/``after_load`` are where
  a staging backend (device <-> host region copies, as vLLM's host transfer buffers do) would copy.
"""

from __future__ import annotations

import abc
import mmap
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .pb import connex_pb2 as pb


class LayoutError(ValueError):
    """vLLM's KV caches are not in a layout this version can serve; the message says why."""


class HandoverError(RuntimeError):
    """connexd's region socket refused the region or answered something unexpected; the message says why."""


HANDOVER_PROTO = b"CONNEX-REGION/1"


def receive_region_fd(info: pb.RegionInfo, timeout_s: float = 10.0) -> int:
    """The descriptor of the region ``region.create`` answered with ``info``, from connexd's region socket.

    One message each way on a SOCK_SEQPACKET unix socket (``@name`` is Linux's abstract namespace): the request
    ``CONNEX-REGION/1 <engine_id> <region_id> <handover_token>``, the answer ``OK`` with one descriptor (SCM_RIGHTS)
    or ``ERR <reason>``. The token works once. The caller maps the descriptor and closes it; any other descriptor
    that arrives is closed here."""
    addr = info.handover_socket
    target = "\0" + addr[1:] if addr.startswith("@") else addr
    ids = (info.engine_id, info.region_id, info.handover_token)
    request = b" ".join([HANDOVER_PROTO, *(v.encode() for v in ids)])
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(target)
            sock.send(request)
            msg, fds, _, _ = socket.recv_fds(sock, 4096, 4, getattr(socket, "MSG_CMSG_CLOEXEC", 0))
        except OSError as e:
            raise HandoverError(f"ConnexConnector: region socket {addr}: {e}") from e
    if msg == b"OK" and len(fds) == 1:
        return fds[0]
    for fd in fds:
        os.close(fd)
    if msg.startswith(b"ERR "):
        reason = msg[4:].decode(errors="replace")
        raise HandoverError(f"ConnexConnector: region socket {addr} refused region {info.region_id}: {reason}")
    raise HandoverError(f"ConnexConnector: region socket {addr} answered {msg[:64]!r} with {len(fds)} descriptors")


def open_region(info: pb.RegionInfo) -> int:
    """A descriptor of the region ``region.create`` answered with: from the region socket when the answer names one
    (connexd's default: any uid), else by opening ``info.path`` (``/proc/<connexd pid>/fd/<n>``: connexd's uid only).
    The caller closes it."""
    if info.handover_socket:
        return receive_region_fd(info)
    return os.open(info.path, os.O_RDWR)


@dataclass(frozen=True)
class Geometry:
    """KV geometry shared by every layer: what connexd's Layout needs.

    Two per-layer layouts are served, each told apart by where the block dimension is:

    - ``planes`` 2: ``(2, num_blocks, ...)``, K and V planes first (vLLM's GPU attention backends);
    - ``planes`` 1: ``(num_blocks, ...)``, K and V inside each block (vLLM's CPU backend:
      ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` with K transposed inside each page).

    A layer is one contiguous slice of the region. ``kv_order`` (with ``num_kv_heads`` and ``head_size``) says
    what a block holds, so that connexd can translate a pull between engines of other block sizes (``"cpu"`` or
    ``"nhd"``, see connexd's Layout); empty, blocks move whole between engines of one shape only.
    """

    layer_names: tuple[str, ...]
    num_blocks: int
    planes: int  # 2: K and V planes first; 1: K and V inside each block
    block_bytes: int  # bytes of one block of one plane of one layer
    block_size: int  # tokens per block
    dtype: torch.dtype
    shape: tuple[int, ...]
    kv_order: str = ""  # connexd's kv_order of a described layout; "" = not described
    num_kv_heads: int = 0  # KV heads of this worker's tensors (its rank's share of the model's)
    head_size: int = 0  # elements of one head's K (or V) vector

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer (every plane, every block)."""
        return self.planes * self.num_blocks * self.block_bytes

    @property
    def bytes(self) -> int:
        """Bytes of the whole region."""
        return len(self.layer_names) * self.layer_bytes

    def layout(self, tp_size: int, tp_rank: int = 0, model_kv_heads: int = 0) -> pb.Layout:
        """connexd's Layout of this geometry as rank tp_rank of tp_size. Described (for translated pulls) when the
        in-block order is known and, at TP > 1, model_kv_heads (the model's KV heads, all ranks together) splits
        into this rank's tensors as vLLM splits them (``rank_heads``); otherwise blocks move whole between engines
        of one shape."""
        heads = self.num_kv_heads if tp_size == 1 else model_kv_heads
        described = bool(self.kv_order) and heads > 0 and rank_heads(heads, tp_size) == self.num_kv_heads
        return pb.Layout(
            num_layers=len(self.layer_names),
            kv_planes=self.planes,
            num_blocks=self.num_blocks,
            block_bytes=self.block_bytes,
            block_size=self.block_size,
            tp_size=tp_size,
            tp_rank=tp_rank,
            kv_order=self.kv_order if described else "",
            num_kv_heads=heads if described else 0,
            head_size=self.head_size if described else 0,
            dtype=_DTYPE_NAMES[self.dtype] if described else "",
        )


def rank_heads(model_kv_heads: int, tp_size: int) -> int:
    """KV heads in one rank's tensors when vLLM splits model_kv_heads over tp_size ranks: an equal share, or one
    head replicated on several ranks when there are fewer heads than ranks (connexd's Layout.HeadRange)."""
    return max(1, model_kv_heads // tp_size) if tp_size > 0 else 0


# torch's KV element types by connexd's names (kvmem.DtypeBytes).
_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
    torch.int8: "int8",
    torch.uint8: "uint8",
}


def describe(
    shape: tuple[int, ...], planes: int, block_size: int, dtype: torch.dtype, cpu_order: bool
) -> tuple[str, int, int]:
    """(kv_order, num_kv_heads, head_size) of a layer tensor's shape, or ("", 0, 0) where the shape does not say:
    ``(2, num_blocks, block_size, heads, head_size)`` is ``"nhd"``; ``[num_blocks, heads, block_size,
    2 * head_size]`` is ``"cpu"`` when cpu_order (the CPU attention kernel keeps the order connexd knows:
    ``cpuorder.known``)."""
    if dtype not in _DTYPE_NAMES:
        return "", 0, 0
    if planes == 2 and len(shape) == 5 and shape[2] == block_size:
        return "nhd", shape[3], shape[4]
    if planes == 1 and cpu_order and len(shape) == 4 and shape[2] == block_size and shape[3] % 2 == 0:
        return "cpu", shape[1], shape[3] // 2
    return "", 0, 0


def _planes(shape: tuple[int, ...], num_blocks: int) -> int:
    """2 for a (2, num_blocks, ...) tensor, 1 for (num_blocks, ...), 0 for neither. num_blocks 0 = unknown
    (then a leading 2 followed by the block dimension means planes first)."""
    if len(shape) >= 3 and shape[0] == 2 and (num_blocks == 0 or shape[1] == num_blocks):
        return 2
    if len(shape) >= 2 and (num_blocks == 0 or shape[0] == num_blocks):
        return 1
    return 0


def geometry(
    kv_caches: dict[str, torch.Tensor], block_size: int, num_blocks: int = 0, cpu_order: bool = False
) -> Geometry:
    """Derives the region geometry from vLLM's KV cache tensors (full attention, one shape for all layers).

    num_blocks is vLLM's block count (``KVCacheConfig.num_blocks``) when known: it says which dimension holds
    the blocks. A tensor in neither served layout, not contiguous, or unlike the others is refused. cpu_order:
    a ``(num_blocks, ...)`` tensor is in the CPU order connexd knows (``describe``)."""
    if not kv_caches:
        raise LayoutError("ConnexConnector: no KV cache tensors to register")
    names = tuple(kv_caches)
    first = kv_caches[names[0]]
    planes = _planes(tuple(first.shape), num_blocks)
    for name, t in kv_caches.items():
        if t.shape != first.shape or t.dtype != first.dtype:
            raise LayoutError(
                f"ConnexConnector: KV cache of layer {name} is {tuple(t.shape)} {t.dtype}, layer {names[0]} is "
                f"{tuple(first.shape)} {first.dtype}; every layer must share one geometry"
            )
        if planes == 0:
            raise LayoutError(
                f"ConnexConnector: KV cache of layer {name} has shape {tuple(t.shape)} (vLLM's KV blocks: "
                f"{num_blocks or 'unknown'}); this version serves full-attention caches shaped (2, num_blocks, ...) "
                "(K and V planes first) or (num_blocks, ...) (K and V inside each block, vLLM's CPU layout)"
            )
        if not t.is_contiguous():
            raise LayoutError(
                f"ConnexConnector: KV cache of layer {name} is not contiguous (shape {tuple(t.shape)}, stride "
                f"{t.stride()}); this version moves whole blocks of a contiguous per-layer tensor"
            )
    # vLLM's hybrid manager lays layer k of every KV cache group on the same bytes (a block id is one group's at a
    # time): such layers are one layer of the region, or it would be twice as large and every pull would copy
    # the other groups' bytes again.
    seen: set[tuple[int, int, int]] = set()
    unique: list[str] = []
    for name, t in kv_caches.items():
        span = _storage_span(t)
        if span not in seen:
            seen.add(span)
            unique.append(name)
    names = tuple(unique)
    blocks = int(first.shape[1] if planes == 2 else first.shape[0])
    page = first[0, 0] if planes == 2 else first[0]
    block_bytes = page.numel() * first.element_size()
    shape = tuple(first.shape)
    order, heads, head_size = describe(shape, planes, block_size, first.dtype, cpu_order)
    return Geometry(names, blocks, planes, block_bytes, block_size, first.dtype, shape, order, heads, head_size)


def _storage_span(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage base address, first byte, end byte) of what t addresses in its storage."""
    es = t.element_size()
    start = t.storage_offset() * es
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) + 1 if t.numel() else 0
    return t.untyped_storage().data_ptr(), start, start + extent * es


class KVMemory(abc.ABC):
    """Where connexd reads and writes a worker's KV blocks."""

    geometry: Geometry

    @abc.abstractmethod
    def attach(
        self,
        kv_caches: dict[str, torch.Tensor],
        create_region: Callable[[pb.Layout], pb.RegionInfo],
        views: Sequence[torch.Tensor] = (),
    ) -> None:
        """Makes kv_caches connexd-servable; create_region runs region.create for a layout (blocking, at start).
        views are the other tensors the model reads the same KV through (the attention layers' bound caches)."""

    def before_hold(self, block_ids: list[int]) -> None:  # noqa: B027 (optional hook)
        """The model wrote these blocks and a hold will serve them: make the bytes visible to connexd."""

    def after_load(self, block_ids: list[int]) -> None:  # noqa: B027 (optional hook)
        """A pull wrote these blocks: make the bytes visible to the model."""

    def move(self, create_region: Callable[[pb.Layout], pb.RegionInfo]) -> None:
        """connexd lost the region (it restarted): create a new one and carry the KV over, so that requests
        running on this engine keep their KV. Called between forward passes (nothing writes the KV meanwhile)."""
        raise NotImplementedError(f"{type(self).__name__} cannot move to a new region")

    @abc.abstractmethod
    def close(self) -> None:
        """Releases what attach took; the tensors must not be used afterwards."""


class SharedRegionMemory(KVMemory):
    """CPU KV caches rebound onto a region connexd created (zero copies).

    vLLM binds each attention layer to a view of the manager's KV tensor (``layer.kv_cache``: the same tensor or
    a kernel-block view of it); every such view is rebound to the same bytes of the region, so the model writes
    what connexd serves and a pull lands where attention reads. A view left on the old memory is an error at
    start (it would serve stale KV), never a silent copy."""

    def __init__(
        self,
        tp_size: int,
        block_size: int,
        num_blocks: int = 0,
        cpu_order: bool = False,
        tp_rank: int = 0,
        model_kv_heads: int = 0,
    ) -> None:
        """tp_rank of tp_size: which rank's region this is; model_kv_heads: the model's KV heads, all ranks together
        (needed to describe a rank's layout at TP > 1; 0 = unknown)."""
        self.tp_size = tp_size
        self.tp_rank = tp_rank
        self.model_kv_heads = model_kv_heads
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.cpu_order = cpu_order  # geometry's cpu_order
        self._mm: mmap.mmap | None = None
        self._targets: list[torch.Tensor] = []  # every tensor rebound onto the region (caches and views)
        self.info: pb.RegionInfo | None = None

    def _map(self, create_region: Callable[[pb.Layout], pb.RegionInfo]) -> tuple[pb.RegionInfo, mmap.mmap]:
        """region.create for this geometry, and the new region mapped shared."""
        g = self.geometry
        info = create_region(g.layout(self.tp_size, self.tp_rank, self.model_kv_heads))
        if info.bytes and info.bytes < g.bytes:
            raise LayoutError(f"ConnexConnector: region {info.region_id} has {info.bytes} bytes, need {g.bytes}")
        fd = open_region(info)
        try:
            mm = mmap.mmap(fd, g.bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the memory
        return info, mm

    def attach(
        self,
        kv_caches: dict[str, torch.Tensor],
        create_region: Callable[[pb.Layout], pb.RegionInfo],
        views: Sequence[torch.Tensor] = (),
    ) -> None:
        for name, t in kv_caches.items():
            if t.device.type != "cpu":
                raise LayoutError(
                    f"ConnexConnector: KV cache of layer {name} is on {t.device}; this version serves CPU KV "
                    "caches through a shared region (CUDA IPC / GPUDirect: see memory.KVMemory)"
                )
        self.geometry = geometry(kv_caches, self.block_size, self.num_blocks, self.cpu_order)
        g = self.geometry
        info, self._mm = self._map(create_region)
        self.info = info
        whole = torch.frombuffer(self._mm, dtype=torch.uint8)
        region = whole.untyped_storage()
        # Where each layer's old bytes go: (old storage, old first byte, old end byte, region byte offset).
        moves = []
        for i, name in enumerate(g.layer_names):
            base, start, end = _storage_span(kv_caches[name])
            moves.append((base, start, end, i * g.layer_bytes))
        targets = {id(t): t for t in views}
        targets.update({id(t): t for t in kv_caches.values()})
        with torch.no_grad():
            for t in targets.values():
                base, start, end = _storage_span(t)
                if t.numel() == 0:
                    continue
                for mbase, mstart, mend, off in moves:
                    if base == mbase and mstart <= start and end <= mend:
                        es = t.element_size()
                        t.set_(region, (off + start - mstart) // es, t.shape, t.stride())  # type: ignore[call-overload]
                        self._targets.append(t)
                        break
                else:
                    raise LayoutError(
                        f"ConnexConnector: a KV cache view {tuple(t.shape)} {t.dtype} the model reads lies outside "
                        "every registered layer's KV tensor; serving it would read stale memory"
                    )

    def move(self, create_region: Callable[[pb.Layout], pb.RegionInfo]) -> None:
        if self._mm is None:
            raise RuntimeError("ConnexConnector: no region to move from (attach has not run)")
        info, mm = self._map(create_region)
        new = torch.frombuffer(mm, dtype=torch.uint8)
        with torch.no_grad():
            new.copy_(torch.frombuffer(self._mm, dtype=torch.uint8)[: new.numel()])
            region = new.untyped_storage()
            for t in self._targets:  # same layout, same offsets: only the storage changes
                t.set_(region, t.storage_offset(), t.shape, t.stride())  # type: ignore[call-overload]
        # The old mapping goes once nothing points into it (closing an mmap with exported buffers raises).
        self._mm, self.info = mm, info

    def close(self) -> None:
        # The tensors still point into the mapping; it goes with the process (closing an mmap with exported
        # buffers raises). Dropping our reference is all that is safe.
        self._mm = None
