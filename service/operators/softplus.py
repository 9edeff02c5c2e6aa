from typing import ClassVar, Literal

import numpy as np
from pydantic import field_validator

from ..descriptors import DataType
from ..descriptors.feature_levels import FeatureLevel, legacy_float
from ..errors import DescriptorError
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import divisor, f32, softplus_params


class Softplus(ActivationDesc):
    """DML_ACTIVATION_SOFTPLUS_OPERATOR_DESC: log(1 + exp(Steepness * x)) / Steepness. ONNX Softplus (Steepness 1).

    Steepness must not be 0 or subnormal as a float32 (the formula divides by it); below DML_FEATURE_LEVEL_6_4 DirectML also
    requires Steepness >= 1, which a request that pins an older FeatureLevel gets.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SOFTPLUS"] = "DML_OPERATOR_ACTIVATION_SOFTPLUS"
    Steepness: Scalar = 1.0

    shader: ClassVar[str] = "softplus"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "log(1 + exp(Steepness * x)) / Steepness"

    @field_validator("Steepness")
    @classmethod
    def _nonzero(cls, steepness: float) -> float:
        return divisor("Steepness", steepness)

    def check_feature_level(self, level: FeatureLevel) -> None:
        super().check_feature_level(level)
        if level < FeatureLevel.FL_6_4 and f32(self.Steepness) < 1.0:
            raise DescriptorError(
                "Steepness", f"Steepness must be at least 1 before {FeatureLevel.FL_6_4.value}, got {self.Steepness!r}"
            )

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        s = f32(self.Steepness)
        return softplus_params(s, 1.0 / s, 1.0)

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.logaddexp(0.0, self.Steepness * x) / self.Steepness
