"""KV memory that connexd can serve: the seam between vLLM's KV cache tensors and connexd's regions.

connexd reads and writes KV blocks in a *region* it owns (``region.create``), laid out as
``((layer * 2 + plane) * num_blocks + block) * block_bytes``. vLLM's attention backends keep one tensor per
layer shaped ``(2, num_blocks, ...)`` (K/V plane first, then blocks): the same order, so a layer's tensor is one
contiguous slice of the region.

Backends (``KVMemory``):

- ``SharedRegionMemory`` (CPU KV caches, this version): connexd creates the region, the worker maps it
  (``mmap`` of the returned ``/proc/<connexd pid>/fd/<n>`` path) and rebinds every KV cache tensor onto its slice
  with ``Tensor.set_`` (in place: the attention layers keep the same tensor objects). Zero copies: what the model
  writes is what connexd serves, and a pull writes straight into the decode engine's KV cache. Chosen over a
  staging copy because a copy costs a full pass over every block on both sides and puts it in the step loop.
- CUDA (not built yet): a backend with the same three hooks. ``attach`` would export the cache with CUDA IPC
  (or register it for GPUDirect RDMA) instead of mapping a host region; ``before_hold``/``after_load`` are where
  a staging backend (device <-> host region copies, as vLLM's host transfer buffers do) would copy.
"""

from __future__ import annotations

import abc
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .pb import connex_pb2 as pb


class LayoutError(ValueError):
    """vLLM's KV caches are not in a layout this version can serve; the message says why."""


@dataclass(frozen=True)
class Geometry:
    """KV geometry shared by every layer: what connexd's Layout needs."""

    layer_names: tuple[str, ...]
    num_blocks: int
    block_bytes: int  # bytes of one block of one plane of one layer
    block_size: int  # tokens per block
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer (both planes, every block)."""
        return 2 * self.num_blocks * self.block_bytes

    @property
    def bytes(self) -> int:
        """Bytes of the whole region."""
        return len(self.layer_names) * self.layer_bytes

    def layout(self, tp_size: int) -> pb.Layout:
        """connexd's Layout of this geometry."""
        return pb.Layout(
            num_layers=len(self.layer_names),
            kv_planes=2,
            num_blocks=self.num_blocks,
            block_bytes=self.block_bytes,
            block_size=self.block_size,
            tp_size=tp_size,
        )


def geometry(kv_caches: dict[str, torch.Tensor], block_size: int) -> Geometry:
    """Checks vLLM's KV cache tensors (full attention: K and V planes first, one shape for all layers)."""
    if not kv_caches:
        raise LayoutError("ConnexConnector: no KV cache tensors to register")
    names = tuple(kv_caches)
    first = kv_caches[names[0]]
    for name, t in kv_caches.items():
        if t.dim() < 3 or t.shape[0] != 2:
            raise LayoutError(
                f"ConnexConnector: KV cache of layer {name} has shape {tuple(t.shape)}; this version serves only "
                "full-attention caches shaped (2, num_blocks, ...) (K and V planes first)"
            )
        if t.shape != first.shape or t.dtype != first.dtype:
            raise LayoutError(
                f"ConnexConnector: KV cache of layer {name} is {tuple(t.shape)} {t.dtype}, layer {names[0]} is "
                f"{tuple(first.shape)} {first.dtype}; every layer must share one geometry"
            )
        if not t.is_contiguous():
            raise LayoutError(f"ConnexConnector: KV cache of layer {name} is not contiguous (stride {t.stride()})")
    num_blocks = int(first.shape[1])
    block_bytes = first[0, 0].numel() * first.element_size()
    return Geometry(names, num_blocks, block_bytes, block_size, first.dtype, tuple(first.shape))


class KVMemory(abc.ABC):
    """Where connexd reads and writes a worker's KV blocks."""

    geometry: Geometry

    @abc.abstractmethod
    def attach(self, kv_caches: dict[str, torch.Tensor], create_region: Callable[[pb.Layout], pb.RegionInfo]) -> None:
        """Makes kv_caches connexd-servable; create_region runs region.create for a layout (blocking, at start)."""

    def before_hold(self, block_ids: list[int]) -> None:  # noqa: B027 (optional hook)
        """The model wrote these blocks and a hold will serve them: make the bytes visible to connexd."""

    def after_load(self, block_ids: list[int]) -> None:  # noqa: B027 (optional hook)
        """A pull wrote these blocks: make the bytes visible to the model."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases what attach took; the tensors must not be used afterwards."""


class SharedRegionMemory(KVMemory):
    """CPU KV caches rebound onto a region connexd created (zero copies)."""

    def __init__(self, tp_size: int, block_size: int) -> None:
        self.tp_size = tp_size
        self.block_size = block_size
        self._mm: mmap.mmap | None = None
        self.info: pb.RegionInfo | None = None

    def attach(self, kv_caches: dict[str, torch.Tensor], create_region: Callable[[pb.Layout], pb.RegionInfo]) -> None:
        for name, t in kv_caches.items():
            if t.device.type != "cpu":
                raise LayoutError(
                    f"ConnexConnector: KV cache of layer {name} is on {t.device}; this version serves CPU KV "
                    "caches through a shared region (CUDA IPC / GPUDirect: see memory.KVMemory)"
                )
        self.geometry = geometry(kv_caches, self.block_size)
        g = self.geometry
        info = create_region(g.layout(self.tp_size))
        if info.bytes and info.bytes < g.bytes:
            raise LayoutError(f"ConnexConnector: region {info.region_id} has {info.bytes} bytes, need {g.bytes}")
        fd = os.open(info.path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, g.bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)  # the mapping keeps the memory; connexd's path names its own descriptor
        self.info = info
        whole = torch.frombuffer(self._mm, dtype=torch.uint8)
        with torch.no_grad():
            for i, name in enumerate(g.layer_names):
                t = kv_caches[name]
                view = whole[i * g.layer_bytes : (i + 1) * g.layer_bytes].view(g.dtype).view(g.shape)
                t.set_(view)  # type: ignore[call-overload]  # in place: every holder of t now sees the region

    def close(self) -> None:
        # The tensors still point into the mapping; it goes with the process (closing an mmap with exported
        # buffers raises). Dropping our reference is all that is safe.
        self._mm = None
