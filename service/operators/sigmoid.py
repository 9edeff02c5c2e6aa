from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc


class Sigmoid(ActivationDesc):
    """DML_ACTIVATION_SIGMOID_OPERATOR_DESC: 1 / (1 + exp(-x)). ONNX Sigmoid."""

    Type: Literal["DML_OPERATOR_ACTIVATION_SIGMOID"] = "DML_OPERATOR_ACTIVATION_SIGMOID"

    shader: ClassVar[str] = "sigmoid"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "1 / (1 + exp(-x))"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float64 without overflow: exp(x) / (1 + exp(x)) for x < 0."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)
