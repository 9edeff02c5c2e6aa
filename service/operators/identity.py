from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import ActivationDesc


class Identity(ActivationDesc):
    """DML_ACTIVATION_IDENTITY_OPERATOR_DESC: x. ONNX Identity (on float tensors; the DirectML activation is float-only)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_IDENTITY"] = "DML_OPERATOR_ACTIVATION_IDENTITY"

    shader: ClassVar[str] = "identity"
    support: ClassVar = legacy_float()
    formula_text: ClassVar[str] = "x"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return x.copy()
