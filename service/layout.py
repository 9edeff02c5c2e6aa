"""How a dispatch walks its tensors: dimensions are coalesced (size-1 dimensions dropped, neighbours
merged where every tensor is contiguous across them), which turns most strided descriptors into the
packed fast path and shortens the index arithmetic of the rest. Elementwise kernels walk one
``Layout``; reductions walk a ``RowLayout`` (rows, and the reduced elements of a row, coalesced
separately). Pure Python, no kp."""
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


def _merge(dims: list[int], strides: list[list[int]]) -> None:
    """Merge dimension d-1 into d, in place, wherever every tensor steps over d exactly once per d-1 step."""
    d = len(dims) - 1
    while d > 0:
        if all(st[d - 1] == st[d] * dims[d] for st in strides):
            dims[d - 1] *= dims[d]
            for st in strides:
                st[d - 1] = st[d]
                del st[d]
            del dims[d]
        d -= 1


def coalesce(tensors: tuple[TensorDesc, ...]) -> Layout:
    """The shortest equivalent walk over tensors that share Sizes (inputs first, output last)."""
    sizes = tensors[0].Sizes
    keep = [d for d, s in enumerate(sizes) if s != 1]
    dims: list[int] = [sizes[d] for d in keep]
    strides: list[list[int]] = [[t.strides[d] for d in keep] for t in tensors]
    _merge(dims, strides)
    if not dims:  # a single element
        return Layout((1,), tuple((1,) for _ in tensors))
    return Layout(tuple(dims), tuple(tuple(st) for st in strides))


@dataclass(frozen=True)
class RowLayout:
    """A reduction's walk: rows are the indices of the kept dimensions (``outer``), a row's elements
    the indices of the reduced ones (``inner``, in dimension order, so the in-row index is the
    row-major index over the reduced axes). Both are coalesced separately, each with per-tensor
    strides (inputs first, output last)."""

    outer: tuple[int, ...]                      # () when there is a single row
    inner: tuple[int, ...]                      # never empty; (1,) when every reduced size is 1
    outer_strides: tuple[tuple[int, ...], ...]
    inner_strides: tuple[tuple[int, ...], ...]

    @property
    def rows(self) -> int:
        return prod(self.outer)

    @property
    def row_len(self) -> int:
        return prod(self.inner)

    @property
    def row_stride(self) -> int:
        """Elements between the first elements of consecutive rows, if the same for every tensor."""
        return self.outer_strides[0][0] if self.outer else self.row_len

    @property
    def packed(self) -> bool:
        """Each row contiguous and rows one row_stride apart in every tensor: the kernels' fast path."""
        return (
            len(self.inner) == 1 and all(st == (1,) for st in self.inner_strides)
            and len(self.outer) <= 1 and len({st for st in self.outer_strides}) == 1
        )

    @property
    def kind(self) -> str:
        return "PACKED" if self.packed else "STRIDED"

    @property
    def rows_contiguous(self) -> bool:
        """The innermost row dimension has stride 1 in the input: neighbouring rows are neighbours in
        memory, so one lane per row reads memory coalesced (a reduction over a non-last axis)."""
        return bool(self.outer) and self.outer_strides[0][-1] == 1 and self.inner_strides[0][-1] != 1

    def meta_words(self) -> list[int]:
        """The strided kernel's table: sizes (row dimensions, then reduced ones), then each tensor's
        strides in the same order, MAX_DIMS words apiece."""
        def pad(values: tuple[int, ...]) -> list[int]:
            return list(values) + [0] * (MAX_DIMS - len(values))
        sizes = self.outer + self.inner
        return pad(sizes) + [w for o, i in zip(self.outer_strides, self.inner_strides) for w in pad(o + i)]


def row_layout(tensors: tuple[TensorDesc, ...], axes: tuple[int, ...]) -> RowLayout:
    """Rows and row elements of a reduction over ``axes`` of tensors that share Sizes."""
    sizes = tensors[0].Sizes
    reduced = set(axes)

    def walk(dims: list[int]) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
        kept = [d for d in dims if sizes[d] != 1]
        merged = [sizes[d] for d in kept]
        strides = [[t.strides[d] for d in kept] for t in tensors]
        _merge(merged, strides)
        return tuple(merged), tuple(tuple(st) for st in strides)

    outer, outer_strides = walk([d for d in range(len(sizes)) if d not in reduced])
    inner, inner_strides = walk(sorted(reduced))
    if not inner:  # every reduced size is 1: one element per row
        inner, inner_strides = (1,), tuple((1,) for _ in tensors)
    return RowLayout(outer, inner, outer_strides, inner_strides)
