from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc


class Relu(ActivationDesc):
    """DML_ACTIVATION_RELU_OPERATOR_DESC: max(0, x). ONNX Relu; NaN stays NaN, as np.maximum(x, 0) has it.

    FLOAT32 and FLOAT16 only so far: DirectML also accepts INT32, INT16 and INT8 from feature level 5_1.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_RELU"] = "DML_OPERATOR_ACTIVATION_RELU"

    shader: ClassVar[str] = "relu"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "max(0, x)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0.0)
