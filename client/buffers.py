"""DirectML buffer layout for numpy arrays: where each element of a tensor lives in its buffer.

A DML buffer tensor is a flat byte buffer plus element strides (zero strides broadcast). These helpers
place a logical array into such a buffer and read it back; both the client and the service use them.
"""
from __future__ import annotations

from math import prod

import numpy as np


def packed_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def min_buffer_bytes(itemsize: int, sizes: tuple[int, ...], strides: tuple[int, ...] | None) -> int:
    """DMLCalcBufferTensorSize: bytes that the elements span, rounded up to 4."""
    if 0 in sizes:
        return 0
    elements = prod(sizes) if strides is None else sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
    return (elements * itemsize + 3) & ~3


def _strided(buffer: np.ndarray, dtype: np.dtype, sizes: tuple[int, ...], strides: tuple[int, ...] | None, writeable: bool) -> np.ndarray:
    strides = packed_strides(sizes) if strides is None else strides
    flat = np.frombuffer(buffer, np.uint8) if not writeable else buffer
    base = flat[: (flat.nbytes // dtype.itemsize) * dtype.itemsize].view(dtype)
    return np.lib.stride_tricks.as_strided(base, sizes, [s * dtype.itemsize for s in strides], writeable=writeable)


def view(buffer: np.ndarray | bytes, dtype: np.dtype, sizes: tuple[int, ...], strides: tuple[int, ...] | None = None) -> np.ndarray:
    """A read-only strided view of ``buffer`` as the logical tensor (no copy)."""
    dtype = np.dtype(dtype)
    if 0 in sizes:
        return np.zeros(sizes, dtype)
    return _strided(buffer, dtype, tuple(sizes), strides, writeable=False)


def to_buffer(array: np.ndarray, strides: tuple[int, ...] | None = None, total_bytes: int | None = None) -> np.ndarray:
    """A zeroed uint8 buffer of ``total_bytes`` (default: the minimum) holding ``array`` at ``strides``.

    With zero strides several elements share a position; the array must then repeat along those
    dimensions (the last write wins)."""
    sizes = tuple(array.shape)
    size = min_buffer_bytes(array.itemsize, sizes, strides) if total_bytes is None else total_bytes
    buffer = np.zeros(size, np.uint8)
    if array.size:
        _strided(buffer, array.dtype, sizes, strides, writeable=True)[...] = array
    return buffer
