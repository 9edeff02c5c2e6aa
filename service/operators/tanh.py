from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc


class Tanh(ActivationDesc):
    """DML_ACTIVATION_TANH_OPERATOR_DESC: tanh(x). ONNX Tanh."""

    Type: Literal["DML_OPERATOR_ACTIVATION_TANH"] = "DML_OPERATOR_ACTIVATION_TANH"

    shader: ClassVar[str] = "tanh"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "tanh(x)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x)
