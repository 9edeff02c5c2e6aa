"""How a dispatch walks its tensors: dimensions are coalesced (size-1 dimensions dropped, neighbours
merged where every tensor is contiguous across them), which turns most strided descriptors into the
packed fast path and shortens the index arithmetic of the rest. Pure Python, no kp."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .descriptors import MAX_DIMS, TensorDesc


@dataclass(frozen=True)
class Layout:
    sizes: tuple[int, ...]                # coalesced, innermost last
    strides: tuple[tuple[int, ...], ...]  # per tensor (inputs, then output), same length as sizes

    @property
    def count(self) -> int:
        return prod(self.sizes)

    @property
    def packed(self) -> bool:
        return len(self.sizes) == 1 and all(s == (1,) for s in self.strides)

    @property
    def kind(self) -> str:
        return "PACKED" if self.packed else "STRIDED"

    def meta_words(self) -> list[int]:
        """The strided kernel's table: sizes, then each tensor's strides, MAX_DIMS words apiece."""
        def pad(values: tuple[int, ...]) -> list[int]:
            return list(values) + [0] * (MAX_DIMS - len(values))
        return pad(self.sizes) + [w for st in self.strides for w in pad(st)]


def coalesce(tensors: tuple[TensorDesc, ...]) -> Layout:
    """The shortest equivalent walk over tensors that share Sizes (inputs first, output last)."""
    sizes = tensors[0].Sizes
    keep = [d for d, s in enumerate(sizes) if s != 1]
    dims: list[int] = [sizes[d] for d in keep]
    strides: list[list[int]] = [[t.strides[d] for d in keep] for t in tensors]
    d = len(dims) - 1
    while d > 0:  # merge dimension d-1 into d when every tensor steps over d exactly once per d-1 step
        if all(st[d - 1] == st[d] * dims[d] for st in strides):
            dims[d - 1] *= dims[d]
            for st in strides:
                st[d - 1] = st[d]
                del st[d]
            del dims[d]
        d -= 1
    if not dims:  # a single element
        return Layout((1,), tuple((1,) for _ in tensors))
    return Layout(tuple(dims), tuple(tuple(st) for st in strides))
