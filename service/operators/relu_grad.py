from typing import ClassVar, Literal, Optional

import numpy as np

from ..descriptors import DataType, TensorDesc
from ..descriptors.feature_levels import INTEGERS_SIGNED, FeatureLevel, modern_float, with_types
from .base import OperatorDesc


class ReluGrad(OperatorDesc):
    """DML_ACTIVATION_RELU_GRAD_OPERATOR_DESC: OutputGradientTensor = InputGradientTensor where
    InputTensor > 0, else 0 (ReLU's backward pass; no ONNX counterpart). INT64 too, beside DirectML's
    signed integers (native where the device has shaderInt64, else in 32-bit words)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_RELU_GRAD"] = "DML_OPERATOR_ACTIVATION_RELU_GRAD"
    onnx_bfloat16: ClassVar[bool] = False  # no ONNX operator
    InputTensor: TensorDesc
    InputGradientTensor: TensorDesc
    OutputGradientTensor: Optional[TensorDesc] = None

    shader: ClassVar[str] = "relu_grad"
    support: ClassVar = with_types(modern_float(FeatureLevel.FL_3_0), FeatureLevel.FL_5_1, INTEGERS_SIGNED)
    in_place: ClassVar[bool] = False  # DirectMLSchema.h flags RELU_GRAD without IN_PLACE_EXECUTION
    input_fields: ClassVar[tuple[str, ...]] = ("InputTensor", "InputGradientTensor")
    output_field: ClassVar[str] = "OutputGradientTensor"
    extra_types: ClassVar = frozenset({DataType.INT64, DataType.FLOAT64})
    emulated_types: ClassVar = frozenset({DataType.INT64})
    formula_text: ClassVar[str] = "InputGradientTensor if InputTensor > 0; else 0"

    def formula(self, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        return np.where(x > 0, dy, 0.0)

    def reference(self, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu":  # in the type itself: INT64 beyond 2^53 would not survive float64
            return np.where(x > 0, dy, 0).astype(x.dtype)
        return super().reference(x, dy)
