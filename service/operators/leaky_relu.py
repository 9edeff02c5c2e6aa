from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar


class LeakyRelu(ActivationDesc):
    """DML_ACTIVATION_LEAKY_RELU_OPERATOR_DESC: x if x >= 0, else Alpha * x. ONNX LeakyRelu."""

    Type: Literal["DML_OPERATOR_ACTIVATION_LEAKY_RELU"] = "DML_OPERATOR_ACTIVATION_LEAKY_RELU"
    Alpha: Scalar = 0.01

    shader: ClassVar[str] = "leaky_relu"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "x if x >= 0, else Alpha * x"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, self.Alpha * x)
