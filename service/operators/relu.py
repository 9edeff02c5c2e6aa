from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import INTEGERS_SIGNED, FeatureLevel, legacy_float, with_types
from .base import ActivationDesc


class Relu(ActivationDesc):
    """DML_ACTIVATION_RELU_OPERATOR_DESC: max(0, x). ONNX Relu; NaN stays NaN, as np.maximum(x, 0) has it.

    Integers: INT8/16/32 from feature level 5_1 (DirectML), INT64 (ONNX Relu's type; native where the
    device has shaderInt64, else in 32-bit words).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_RELU"] = "DML_OPERATOR_ACTIVATION_RELU"

    shader: ClassVar[str] = "relu"
    support: ClassVar = with_types(legacy_float(), FeatureLevel.FL_5_1, INTEGERS_SIGNED)
    extra_types: ClassVar = frozenset({DataType.INT64, DataType.FLOAT64})  # ONNX Relu's (FLOAT64: glsl/relu.comp)
    emulated_types: ClassVar = frozenset({DataType.INT64})
    formula_text: ClassVar[str] = "max(0, x)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0.0)

    def reference(self, x: np.ndarray) -> np.ndarray:
        if x.dtype.kind in "iu":  # in the type itself: INT64 beyond 2^53 would not survive float64
            return np.maximum(x, 0).astype(x.dtype)
        return super().reference(x)
