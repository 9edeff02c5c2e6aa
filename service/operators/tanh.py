from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import ActivationDesc


class Tanh(ActivationDesc):
    """DML_ACTIVATION_TANH_OPERATOR_DESC: tanh(x). ONNX Tanh."""

    Type: Literal["DML_OPERATOR_ACTIVATION_TANH"] = "DML_OPERATOR_ACTIVATION_TANH"

    shader: ClassVar[str] = "tanh"
    support: ClassVar = legacy_float()
    formula_text: ClassVar[str] = "tanh(x)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x)
