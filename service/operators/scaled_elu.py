from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import f32


class ScaledElu(ActivationDesc):
    """DML_ACTIVATION_SCALED_ELU_OPERATOR_DESC: Gamma * x if x > 0, else Gamma * (Alpha * exp(x) - Alpha). ONNX Selu.

    The defaults are ONNX Selu's (and DirectMLX's) float32 constants; the documentation rounds them
    to 1.6732 and 1.0507.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SCALED_ELU"] = "DML_OPERATOR_ACTIVATION_SCALED_ELU"
    Alpha: Scalar = 1.67326319217681884765625
    Gamma: Scalar = 1.05070102214813232421875

    shader: ClassVar[str] = "scaled_elu"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "Gamma * x if x > 0, else Gamma * (Alpha * exp(x) - Alpha)"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return (f32(self.Gamma), f32(self.Gamma) * f32(self.Alpha))

    def formula(self, x: np.ndarray) -> np.ndarray:
        # Gamma * Alpha * expm1(x) is the same number without the cancellation of exp(x) - 1 near 0.
        return np.where(x > 0, self.Gamma * x, self.Gamma * self.Alpha * np.expm1(x))
