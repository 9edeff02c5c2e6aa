"""DML_TENSOR_DESC / DML_BUFFER_TENSOR_DESC as a pydantic model, with DirectML's size rules."""
from __future__ import annotations

from enum import IntFlag
from math import prod
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from client.buffers import min_buffer_bytes, packed_strides

from ..errors import DescriptorError
from .canonical import CanonicalModel
from .datatypes import DataType as DType

MAX_DIMS = 8                     # DML_TENSOR_DIMENSION_COUNT_MAX1
MAX_ELEMENTS = 2**32 - 1         # a tensor may have at most 2^32-1 elements
UINT32 = Annotated[int, Field(ge=0, le=2**32 - 1)]


class TensorFlags(IntFlag):
    """DML_TENSOR_FLAGS. OWNED_BY_DML marks weights bound at initialisation; vkact has no separate
    initialisation step, so it accepts the flag and treats the tensor like any other input."""

    NONE = 0
    OWNED_BY_DML = 1


def calc_buffer_tensor_size(data_type: DType, sizes: tuple[int, ...], strides: tuple[int, ...] | None) -> int:
    """DMLCalcBufferTensorSize: the minimum TotalTensorSizeInBytes, rounded up to 4 bytes.

    vkact allows size-0 dimensions (empty tensors, as ONNX does); they need 0 bytes.
    """
    return min_buffer_bytes(data_type.info.size, sizes, strides)


class TensorDesc(CanonicalModel):
    """DML_BUFFER_TENSOR_DESC (with DML_TENSOR_DESC's Type folded in: buffers are the only kind).

    DimensionCount and TotalTensorSizeInBytes may be omitted; they then take the values DirectML would
    require (the length of Sizes, and DMLCalcBufferTensorSize).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    Type: Literal["DML_TENSOR_TYPE_BUFFER"] = "DML_TENSOR_TYPE_BUFFER"
    DataType: DType
    Flags: Annotated[int, Field(ge=0, le=int(TensorFlags.OWNED_BY_DML))] = 0
    DimensionCount: int | None = None
    Sizes: tuple[UINT32, ...]
    Strides: tuple[UINT32, ...] | None = None
    TotalTensorSizeInBytes: Annotated[int, Field(ge=0, le=2**64 - 1)] | None = None
    GuaranteedBaseOffsetAlignment: UINT32 = 0

    @model_validator(mode="after")
    def _dml_rules(self) -> TensorDesc:
        dims = len(self.Sizes)
        if self.DimensionCount is not None and self.DimensionCount != dims:
            raise DescriptorError("DimensionCount", f"DimensionCount is {self.DimensionCount} but Sizes has {dims} entries")
        if not 1 <= dims <= MAX_DIMS:
            raise DescriptorError("DimensionCount", f"DimensionCount must be 1 to {MAX_DIMS}, got {dims}")
        if self.Strides is not None and len(self.Strides) != dims:
            raise DescriptorError("Strides", f"Strides has {len(self.Strides)} entries, DimensionCount is {dims}")
        if prod(self.Sizes) > MAX_ELEMENTS:
            raise DescriptorError("Sizes", f"a tensor may have at most {MAX_ELEMENTS} elements")
        align = self.GuaranteedBaseOffsetAlignment
        if align and (align & (align - 1) or align < self.DataType.info.size):
            raise DescriptorError(
                "GuaranteedBaseOffsetAlignment",
                "GuaranteedBaseOffsetAlignment must be 0 or a power of two no smaller than the element size",
            )
        minimum = self.min_bytes
        if self.TotalTensorSizeInBytes is None:
            object.__setattr__(self, "TotalTensorSizeInBytes", minimum)
        elif self.TotalTensorSizeInBytes < minimum:
            raise DescriptorError(
                "TotalTensorSizeInBytes",
                f"TotalTensorSizeInBytes is {self.TotalTensorSizeInBytes}, "
                f"but Sizes, Strides and DataType need at least {minimum} (DMLCalcBufferTensorSize)",
            )
        object.__setattr__(self, "DimensionCount", dims)
        return self

    @property
    def min_bytes(self) -> int:
        return calc_buffer_tensor_size(self.DataType, self.Sizes, self.Strides)

    @property
    def total_bytes(self) -> int:
        assert self.TotalTensorSizeInBytes is not None  # filled in by the validator
        return self.TotalTensorSizeInBytes

    @property
    def element_count(self) -> int:
        return prod(self.Sizes)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements, packed ones when none were given."""
        return self.Strides if self.Strides is not None else packed_strides(self.Sizes)

    @property
    def broadcasts(self) -> bool:
        """True if some element is read more than once (a zero stride over a dimension of size > 1)."""
        return any(st == 0 and s > 1 for s, st in zip(self.Sizes, self.strides))

    def overlaps(self) -> bool:
        """True if two elements share a position, which an output must never do."""
        if self.element_count == 0:
            return False
        dims = sorted((st, s) for s, st in zip(self.Sizes, self.strides) if s > 1)
        reach = 1  # elements spanned by the faster dimensions seen so far
        for stride, size in dims:
            if stride < reach:
                return True
            reach = stride * (size - 1) + reach
        return False

    def span_bytes(self) -> int:
        """Bytes from the first to the last element (the unrounded minimum size)."""
        if self.element_count == 0:
            return 0
        last = sum((s - 1) * st for s, st in zip(self.Sizes, self.strides))
        return (last + 1) * self.DataType.info.size

    def like(self, **changes: object) -> TensorDesc:
        """A copy with some fields changed, re-validated (TotalTensorSizeInBytes recomputed unless given)."""
        data = self.model_dump(exclude={"DimensionCount", "TotalTensorSizeInBytes"})
        data.update(changes)
        return TensorDesc.model_validate(data)
