from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import mul_add_params


class HardSigmoid(ActivationDesc):
    """DML_ACTIVATION_HARD_SIGMOID_OPERATOR_DESC: max(0, min(Alpha * x + Beta, 1)). ONNX HardSigmoid."""

    Type: Literal["DML_OPERATOR_ACTIVATION_HARD_SIGMOID"] = "DML_OPERATOR_ACTIVATION_HARD_SIGMOID"
    Alpha: Scalar = 0.2
    Beta: Scalar = 0.5

    shader: ClassVar[str] = "hard_sigmoid"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "max(0, min(Alpha * x + Beta, 1))"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return mul_add_params(self.Alpha, self.Beta)

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, np.minimum(self.Alpha * x + self.Beta, 1.0))
