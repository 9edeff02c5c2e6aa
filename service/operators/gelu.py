import math
from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import FeatureLevel, modern_float
from .base import FLOAT64_ONLY, ActivationDesc

_erfc = np.frompyfunc(math.erfc, 1, 1)


class Gelu(ActivationDesc):
    """DML_ACTIVATION_GELU_OPERATOR_DESC: 0.5 * x * (1 + erf(x / sqrt(2))). ONNX Gelu (approximate="none").

    The exact erf form only (DirectML has no tanh approximation); GELU(-inf) is 0, the limit.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_GELU"] = "DML_OPERATOR_ACTIVATION_GELU"

    shader: ClassVar[str] = "gelu"
    support: ClassVar = modern_float(FeatureLevel.FL_5_1)
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "0.5 * x * (1 + erf(x / sqrt(2)))"

    def formula(self, x: np.ndarray) -> np.ndarray:
        # x * Phi(x) = 0.5 * x * erfc(-x / sqrt 2): erfc keeps its relative accuracy in the tail x << 0,
        # where 1 + erf(...) would cancel even in float64.
        phi = 0.5 * _erfc(-x / math.sqrt(2.0)).astype(np.float64)
        return np.where(np.isneginf(x), -0.0, x * phi)
