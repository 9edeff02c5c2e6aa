from typing import ClassVar, Literal

import numpy as np

from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar


class ScaledTanh(ActivationDesc):
    """DML_ACTIVATION_SCALED_TANH_OPERATOR_DESC: Alpha * tanh(Beta * x).

    No current ONNX operator (the experimental ScaledTanh was removed before opset 10); the defaults
    are DirectML's.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SCALED_TANH"] = "DML_OPERATOR_ACTIVATION_SCALED_TANH"
    onnx_bfloat16: ClassVar[bool] = False  # no ONNX operator
    Alpha: Scalar = 1.0
    Beta: Scalar = 0.5

    shader: ClassVar[str] = "scaled_tanh"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "Alpha * tanh(Beta * x)"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return self.Alpha * np.tanh(self.Beta * x)
