from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc


class Identity(ActivationDesc):
    """DML_ACTIVATION_IDENTITY_OPERATOR_DESC: x. ONNX Identity (on float tensors; the DirectML activation is float-only)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_IDENTITY"] = "DML_OPERATOR_ACTIVATION_IDENTITY"

    shader: ClassVar[str] = "identity"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "x"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return x.copy()
