from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar


class ThresholdedRelu(ActivationDesc):
    """DML_ACTIVATION_THRESHOLDED_RELU_OPERATOR_DESC: x if x > Alpha, else 0. ONNX ThresholdedRelu.

    NaN gives 0 (the comparison is false), as in ONNX's reference, np.where(x > alpha, x, 0).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_THRESHOLDED_RELU"] = "DML_OPERATOR_ACTIVATION_THRESHOLDED_RELU"
    Alpha: Scalar = 1.0

    shader: ClassVar[str] = "thresholded_relu"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "x if x > Alpha, else 0"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(x > self.Alpha, x, 0.0)
