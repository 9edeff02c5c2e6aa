from typing import ClassVar, Literal, Optional

import numpy as np

from ..descriptors import DataType, TensorDesc
from ..descriptors.feature_levels import INTEGERS_SIGNED, FeatureLevel, legacy_float, with_types
from .base import OperatorDesc


class ParameterizedRelu(OperatorDesc):
    """DML_ACTIVATION_PARAMETERIZED_RELU_OPERATOR_DESC: x if x >= 0, else SlopeTensor * x.

    ONNX PRelu. DirectML requires SlopeTensor to have the input's Sizes; ONNX's broadcasting slope is
    expressed with zero strides (a per-channel slope of an NCHW input: Strides {0, 1, 0, 0}).
    Integer tensors (INT8/16/32 from 5_1): slope * x wraps to the type, as numpy's integer product.
    INT64, UINT32 and UINT64 too (ONNX PRelu's types; the 64-bit ones native where the device has
    shaderInt64, else in 32-bit words): an unsigned x is never negative, so the result is x.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"] = "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"
    InputTensor: TensorDesc
    SlopeTensor: TensorDesc
    OutputTensor: Optional[TensorDesc] = None

    shader: ClassVar[str] = "parameterized_relu"
    support: ClassVar = with_types(legacy_float(), FeatureLevel.FL_5_1, INTEGERS_SIGNED)
    input_fields: ClassVar[tuple[str, ...]] = ("InputTensor", "SlopeTensor")
    extra_types: ClassVar = frozenset({DataType.INT64, DataType.UINT32, DataType.UINT64, DataType.FLOAT64})
    emulated_types: ClassVar = frozenset({DataType.INT64, DataType.UINT64})
    formula_text: ClassVar[str] = "x if x >= 0; else SlopeTensor * x"

    def formula(self, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, slope * x)

    def reference(self, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu":  # the product in the integer type itself: it wraps, float64 would not
            with np.errstate(over="ignore"):
                return np.where(x >= 0, x, slope * x).astype(x.dtype)
        return super().reference(x, slope)
