"""numpy arrays <-> DML_BUFFER_TENSOR_DESC dicts plus their buffers (no I/O).

A C-contiguous array travels as it is, without Strides. A strided view (``x[:, ::2]``, ``x.T``,
``np.broadcast_to``) travels as its element strides plus the memory from its first element to its
last, so the service sees the same layout numpy has and the client copies nothing it need not. Views
that DirectML cannot express (negative strides, strides that are not whole elements), or whose span
would be mostly gaps, are packed instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any, Optional

import numpy as np

from .buffers import min_buffer_bytes, view
from .json_values import BFLOAT16

#: DML_TENSOR_DATA_TYPE name -> little-endian numpy dtype. Mirrors service/descriptors/datatypes.py;
#: the client must not import the service. tests/client checks that the two tables agree.
DATA_TYPES: dict[str, np.dtype] = {
    "DML_TENSOR_DATA_TYPE_FLOAT32": np.dtype("<f4"),
    "DML_TENSOR_DATA_TYPE_FLOAT16": np.dtype("<f2"),
    "DML_TENSOR_DATA_TYPE_UINT32": np.dtype("<u4"),
    "DML_TENSOR_DATA_TYPE_UINT16": np.dtype("<u2"),
    "DML_TENSOR_DATA_TYPE_UINT8": np.dtype("u1"),
    "DML_TENSOR_DATA_TYPE_INT32": np.dtype("<i4"),
    "DML_TENSOR_DATA_TYPE_INT16": np.dtype("<i2"),
    "DML_TENSOR_DATA_TYPE_INT8": np.dtype("i1"),
    "DML_TENSOR_DATA_TYPE_FLOAT64": np.dtype("<f8"),
    "DML_TENSOR_DATA_TYPE_UINT64": np.dtype("<u8"),
    "DML_TENSOR_DATA_TYPE_INT64": np.dtype("<i8"),
    # not DirectML's: ONNX's bfloat16, as ml_dtypes.bfloat16 (or raw bits, see from_array)
    "VKACT_TENSOR_DATA_TYPE_BFLOAT16": BFLOAT16,
}
_NAMES = {dtype: name for name, dtype in DATA_TYPES.items()}
#: Short names a caller may give for a DataType its arrays' dtype cannot say (see from_array).
_ALIASES = {"bfloat16": "VKACT_TENSOR_DATA_TYPE_BFLOAT16", "BF16": "VKACT_TENSOR_DATA_TYPE_BFLOAT16"}
RAW_BFLOAT16 = np.dtype("<u2")  # bfloat16 as its bits, where ml_dtypes is not installed

#: A strided view is packed when its span is more than this many times its elements' bytes: copying
#: is cheaper than sending (and having the service read) the gaps, and it keeps clear of 413s.
MAX_SPAN_RATIO = 2.0
_UINT32_MAX = 2**32 - 1


def data_type_name(dtype: np.dtype) -> str:
    """The DML_TENSOR_DATA_TYPE of a dtype, whatever its byte order."""
    name = _NAMES.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        known = ", ".join(str(d) for d in _NAMES)
        raise TypeError(f"numpy dtype {np.dtype(dtype)} has no DML_TENSOR_DATA_TYPE; use one of {known}")
    return name


def dtype_of(name: str) -> np.dtype:
    try:
        return DATA_TYPES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown DataType {name!r}") from None


def span_bytes(itemsize: int, sizes: tuple[int, ...], strides: Optional[tuple[int, ...]]) -> int:
    """Bytes from the first element to the end of the last one (min_buffer_bytes before rounding)."""
    if 0 in sizes:
        return 0
    elements = prod(sizes) if strides is None else sum((s - 1) * st for s, st in zip(sizes, strides)) + 1
    return elements * itemsize


@dataclass(frozen=True)
class Tensor:
    """A tensor ready to send: its descriptor and its buffer (uint8, TotalTensorSizeInBytes long)."""

    desc: dict[str, Any]
    buffer: np.ndarray
    dtype: np.dtype

    @property
    def span(self) -> int:
        return span_bytes(self.dtype.itemsize, tuple(self.desc["Sizes"]), self.desc.get("Strides"))


def from_array(array: Any, data_type: Optional[str] = None) -> Tensor:
    """The descriptor and buffer that carry ``array`` (0-d arrays become shape (1,), as DirectML has no
    scalars). Plain Python numbers and lists become float32: numpy would pick float64, which few
    DirectML operators take; numpy arrays keep their dtype. ``data_type`` names the DataType where the
    dtype cannot: "bfloat16" for raw bfloat16 bits in a uint16 array (numpy has no bfloat16; an
    ml_dtypes.bfloat16 array says it itself)."""
    a = np.asarray(array)
    if data_type is not None:
        a = _as_data_type(a, data_type)
    if not isinstance(array, (np.ndarray, np.generic)) and a.dtype == np.float64:
        a = a.astype(np.float32)
    data_type = data_type_name(a.dtype)
    if a.dtype != a.dtype.newbyteorder("<"):  # the wire is little-endian
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.ndim == 0:
        a = a.reshape(1)
    strides = _element_strides(a)
    if strides is None:
        a = np.ascontiguousarray(a)
        raw = a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)
    else:
        # The view's own memory from its first element to its last: strides are non-negative, so the
        # first element is the lowest address, and every numpy array lies in one contiguous block.
        count = span_bytes(a.itemsize, a.shape, strides) // a.itemsize
        raw = np.lib.stride_tricks.as_strided(a, (count,), (a.itemsize,), writeable=False).view(np.uint8)
    total = min_buffer_bytes(a.itemsize, a.shape, strides)
    if raw.nbytes != total:  # DWORD padding; the zeros are never read as elements
        padded = np.zeros(total, np.uint8)
        padded[: raw.nbytes] = raw
        raw = padded
    desc: dict[str, Any] = {"DataType": data_type, "Sizes": list(a.shape)}
    if strides is not None:
        desc["Strides"] = list(strides)
    desc["TotalTensorSizeInBytes"] = total
    return Tensor(desc, raw, a.dtype)


def _as_data_type(a: np.ndarray, data_type: str) -> np.ndarray:
    """``a`` viewed as ``data_type``'s dtype: the same dtype already, or raw bits of its width."""
    dtype = dtype_of(_ALIASES.get(data_type, data_type))
    if a.dtype == dtype:
        return a
    if dtype == BFLOAT16 and a.dtype.newbyteorder("<") == RAW_BFLOAT16:
        return a.astype(RAW_BFLOAT16, copy=False).view(BFLOAT16)
    raise TypeError(f"data_type {data_type} takes arrays of {dtype}" + (" or raw bits as uint16" if dtype == BFLOAT16 else "") + f", not {a.dtype}")


def _element_strides(a: np.ndarray) -> Optional[tuple[int, ...]]:
    """Element strides to send, or None when the array should travel packed."""
    if a.flags.c_contiguous or a.size == 0:
        return None
    # A size-1 dimension's stride never moves (numpy leaves anything there, even negative values).
    byte_strides = [0 if n == 1 else s for n, s in zip(a.shape, a.strides)]
    if any(s < 0 or s % a.itemsize for s in byte_strides):
        return None
    strides = tuple(s // a.itemsize for s in byte_strides)
    if max(strides) > _UINT32_MAX or span_bytes(a.itemsize, a.shape, strides) > MAX_SPAN_RATIO * a.nbytes:
        return None
    return strides


def output_desc(like: dict[str, Any], strides: Optional[tuple[int, ...]]) -> dict[str, Any]:
    """An output descriptor with ``like``'s DataType and Sizes at ``strides`` (None: packed)."""
    sizes = tuple(like["Sizes"])
    steps = None if strides is None else tuple(int(s) for s in strides)
    desc: dict[str, Any] = {"DataType": like["DataType"], "Sizes": list(sizes)}
    if steps is not None:
        desc["Strides"] = list(steps)
    desc["TotalTensorSizeInBytes"] = min_buffer_bytes(dtype_of(like["DataType"]).itemsize, sizes, steps)
    return desc


@dataclass(frozen=True)
class Layout:
    """A received descriptor, checked so that reading its buffer cannot stray outside it."""

    dtype: np.dtype
    sizes: tuple[int, ...]
    strides: Optional[tuple[int, ...]]
    total: int  # TotalTensorSizeInBytes

    @property
    def span(self) -> int:
        return span_bytes(self.dtype.itemsize, self.sizes, self.strides)

    @classmethod
    def of(cls, desc: dict[str, Any]) -> Layout:
        dtype = dtype_of(desc["DataType"])
        sizes = tuple(_count(s) for s in desc["Sizes"])
        raw = desc.get("Strides")
        strides = None if raw is None else tuple(_count(s) for s in raw)
        if strides is not None and len(strides) != len(sizes):
            raise ValueError(f"{len(strides)} Strides for {len(sizes)} Sizes")
        total = desc.get("TotalTensorSizeInBytes")
        total = min_buffer_bytes(dtype.itemsize, sizes, strides) if total is None else _count(total)
        layout = cls(dtype, sizes, strides, total)
        if total < layout.span:  # buffers.view uses as_strided, which would read past the buffer
            raise ValueError(f"TotalTensorSizeInBytes {total} is less than the {layout.span} bytes its elements span")
        return layout

    def to_array(self, buffer: np.ndarray) -> np.ndarray:
        """The logical tensor in ``buffer`` (at least ``total`` bytes), as a packed array owning its memory."""
        if len(buffer) < self.total:
            raise ValueError(f"{len(buffer)} bytes; TotalTensorSizeInBytes is {self.total}")
        packed: np.ndarray = view(buffer, self.dtype, self.sizes, self.strides).copy()
        return packed


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def to_array(desc: dict[str, Any], buffer: np.ndarray) -> np.ndarray:
    """The logical tensor that ``buffer`` holds under the descriptor ``desc`` (a new packed array)."""
    return Layout.of(desc).to_array(buffer)
