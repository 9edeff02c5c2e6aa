from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar


class Elu(ActivationDesc):
    """DML_ACTIVATION_ELU_OPERATOR_DESC: x if x >= 0, else Alpha * (exp(x) - 1). ONNX Elu."""

    Type: Literal["DML_OPERATOR_ACTIVATION_ELU"] = "DML_OPERATOR_ACTIVATION_ELU"
    Alpha: Scalar = 1.0

    shader: ClassVar[str] = "elu"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "x if x >= 0, else Alpha * (exp(x) - 1)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, self.Alpha * np.expm1(x))
