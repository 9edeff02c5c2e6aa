"""What the softmax family shares: the reduced axes, DirectML's rules for them, and the float64 maths.

SOFTMAX, LOG_SOFTMAX and HARDMAX (FL 1_0) reduce the last dimension of an input whose *effective rank*
(DimensionCount after dropping leading size-1 dimensions) is at most 2, so {1,1,N,W} is N rows of W.
SOFTMAX1, LOG_SOFTMAX1 and HARDMAX1 (FL 5_1) reduce jointly over a set of axes, ``Axes`` (``AxisCount``
entries; unique, each in [0, DimensionCount-1]). DirectML flags all six without in-place execution.

The references follow numpy (and ONNX's reference implementation): softmax is exp(x - max) / sum and
log-softmax (x - max) - log(sum) over the reduced axes, so a row holding NaN or +inf, or only -inf,
gives NaN throughout; hardmax puts its 1 where numpy's argmax points over the reduced axes flattened
in dimension order: the first maximum, or the first NaN if the row has one.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Optional

import numpy as np
from pydantic import Field, model_validator

from ..descriptors.feature_levels import FeatureLevel, legacy_float, modern_float
from ..descriptors.tensor import UINT32
from ..errors import DescriptorError
from .base import FLOAT64_ONLY, ActivationDesc

# -- the float64 references ----------------------------------------------------------------------


def softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.size == 0:
        return x.copy()
    e = np.exp(x - np.max(x, axis=axes, keepdims=True))
    return e / np.sum(e, axis=axes, keepdims=True)


def log_softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """(x - max) - log(sum(exp(x - max))), the log taken as log1p of the sum less one maximum's term
    (exactly 1): where one element dominates, log(1 + s) of a rounded 1 + s keeps nothing of an s
    below 1e-16, in float64 too, and the maximum's output -log(sum) is that small."""
    if x.size == 0:
        return x.copy()
    d = x - np.max(x, axis=axes, keepdims=True)
    top = d == 0
    rest = np.sum(np.where(top, 0.0, np.exp(d)), axis=axes, keepdims=True)
    return d - np.log1p(rest + (np.sum(top, axis=axes, keepdims=True) - 1))


def hardmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    if x.size == 0:
        return x.copy()
    kept = [d for d in range(x.ndim) if d not in axes]
    order = kept + sorted(axes)
    t = np.transpose(x, order)
    rows = t.reshape(t.shape[: len(kept)] + (-1,))   # the reduced axes flattened, in dimension order
    y = np.zeros_like(rows)
    np.put_along_axis(y, np.argmax(rows, axis=-1)[..., None], 1, axis=-1)
    return np.transpose(y.reshape(t.shape), np.argsort(order))


# -- descriptors ---------------------------------------------------------------------------------


class ReductionDesc(ActivationDesc):
    """An activation that reduces over axes: its kernel is a row reduction (glsl/common/reduction.glsl)."""

    kind: ClassVar[str] = "reduction"
    in_place: ClassVar[bool] = False
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/reduction_f64.glsl)

    def reduced_axes(self) -> tuple[int, ...]:
        """The reduced dimensions, increasing (LastAxisReduction and the Axes operators define it)."""
        raise TypeError(f"{type(self).__name__} defines no reduced axes")


class LastAxisReduction(ReductionDesc):
    """SOFTMAX, LOG_SOFTMAX, HARDMAX: the last dimension, effective rank at most 2."""

    support: ClassVar = legacy_float()

    def reduced_axes(self) -> tuple[int, ...]:
        return (len(self.InputTensor.Sizes) - 1,)

    @classmethod
    def field_elsewhere(cls, field: str) -> str | None:
        """Where a field this operator lacks lives: Axes and AxisCount belong to its "1" successor."""
        if field in AxesReduction.length_fields or field == "Axes":
            return f"{cls.type_name()} reduces over the last dimension only; {cls.type_name()}1 takes {field}"
        return None

    @model_validator(mode="before")
    @classmethod
    def _no_axes(cls, data: object) -> object:
        # Without this, pydantic's "Extra inputs are not permitted" would not say which operator has Axes.
        for field in ("Axes", "AxisCount"):
            if isinstance(data, dict) and field in data:
                raise DescriptorError(field, cls.field_elsewhere(field) or "")
        return data

    @model_validator(mode="after")
    def _effective_rank(self) -> LastAxisReduction:
        sizes = self.InputTensor.Sizes
        leading = next((d for d, s in enumerate(sizes) if s != 1), len(sizes) - 1)
        rank = len(sizes) - leading
        if rank > 2:
            raise DescriptorError(
                "InputTensor.Sizes",
                f"{self.type_name()} takes an input of effective rank at most 2 (leading size-1 dimensions "
                f"dropped), got Sizes {list(sizes)} of effective rank {rank}; "
                f"{self.type_name()}1 reduces over any Axes",
            )
        return self


AXES_DESCRIPTION = "the dimensions reduced jointly; default: the last one"


class AxesReduction(ReductionDesc):
    """SOFTMAX1, LOG_SOFTMAX1, HARDMAX1: jointly over ``Axes``.

    ``AxisCount`` may be omitted: it then is the length of ``Axes``, as DirectML requires. ``Axes``
    may be omitted too (DirectML documents no default): it then is the last dimension, ONNX's default
    axis (-1) for Softmax, LogSoftmax and Hardmax 13.
    """

    AxisCount: Optional[UINT32] = None
    Axes: Annotated[Optional[tuple[UINT32, ...]], Field(description=AXES_DESCRIPTION)] = None

    support: ClassVar = modern_float(FeatureLevel.FL_5_1)
    length_fields: ClassVar[tuple[str, ...]] = ("AxisCount",)

    def reduced_axes(self) -> tuple[int, ...]:
        assert self.Axes is not None  # filled in by the validator
        return tuple(sorted(self.Axes))

    @model_validator(mode="after")
    def _axes(self) -> AxesReduction:
        axes, dims = self.Axes, len(self.InputTensor.Sizes)
        if axes is None:
            if self.AxisCount is not None:
                raise DescriptorError("Axes", f"AxisCount is {self.AxisCount} but Axes is missing")
            axes = (dims - 1,)
            object.__setattr__(self, "Axes", axes)
        if self.AxisCount is not None and self.AxisCount != len(axes):
            raise DescriptorError("AxisCount", f"AxisCount is {self.AxisCount} but Axes has {len(axes)} entries")
        if not axes:
            raise DescriptorError("Axes", "Axes must name at least one axis")
        for i, axis in enumerate(axes):
            if axis >= dims:
                raise DescriptorError(f"Axes[{i}]", f"Axes[{i}] is {axis}; axes of a {dims}-dimensional input are 0 to {dims - 1}")
        if len(set(axes)) != len(axes):
            raise DescriptorError("Axes", f"Axes {list(axes)} names an axis twice")
        object.__setattr__(self, "AxisCount", len(axes))
        return self
