from typing import ClassVar, Literal

import numpy as np
from pydantic import field_validator

from ..descriptors import DataType
from ..descriptors.feature_levels import FeatureLevel, modern_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import divisor, f32, split


class Celu(ActivationDesc):
    """DML_ACTIVATION_CELU_OPERATOR_DESC: max(0, x) + min(0, Alpha * (exp(x / Alpha) - 1)). ONNX Celu."""

    Type: Literal["DML_OPERATOR_ACTIVATION_CELU"] = "DML_OPERATOR_ACTIVATION_CELU"
    Alpha: Scalar = 1.0

    shader: ClassVar[str] = "celu"
    kernels: ClassVar[tuple[str, ...]] = ("celu", "celu_negative_alpha")
    support: ClassVar = modern_float(FeatureLevel.FL_3_0)
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "max(0, x) + min(0, Alpha * (exp(x / Alpha) - 1))"

    @field_validator("Alpha")
    @classmethod
    def _nonzero(cls, alpha: float) -> float:
        return divisor("Alpha", alpha)

    def kernel(self) -> str:
        return "celu" if self.Alpha > 0 else "celu_negative_alpha"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        alpha = f32(self.Alpha)
        return (alpha, 1.0 / alpha, *split(alpha))

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, x) + np.minimum(0.0, self.Alpha * np.expm1(x / self.Alpha))
