from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import FeatureLevel, legacy_float
from .base import ActivationDesc, Scalar


class Shrink(ActivationDesc):
    """DML_ACTIVATION_SHRINK_OPERATOR_DESC: x + Bias if x < -Threshold, x - Bias if x > Threshold, else 0.

    ONNX Shrink with bias = Bias and lambd = Threshold, tested in ONNX's order (x < -Threshold first),
    which decides a negative Threshold, where both conditions can hold. NaN gives 0 (every comparison
    is false).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SHRINK"] = "DML_OPERATOR_ACTIVATION_SHRINK"
    Bias: Scalar = 0.0
    Threshold: Scalar = 0.5

    shader: ClassVar[str] = "shrink"
    support: ClassVar = legacy_float(FeatureLevel.FL_2_0)
    formula_text: ClassVar[str] = "x + Bias if x < -Threshold; x - Bias if x > Threshold; else 0"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < -self.Threshold, x + self.Bias, np.where(x > self.Threshold, x - self.Bias, 0.0))
