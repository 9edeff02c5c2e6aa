from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc


class Softsign(ActivationDesc):
    """DML_ACTIVATION_SOFTSIGN_OPERATOR_DESC: x / (1 + |x|). ONNX Softsign; +-inf gives +-1."""

    Type: Literal["DML_OPERATOR_ACTIVATION_SOFTSIGN"] = "DML_OPERATOR_ACTIVATION_SOFTSIGN"

    shader: ClassVar[str] = "softsign"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "x / (1 + |x|)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(np.isinf(x), np.sign(x), x / (1.0 + np.abs(x)))
