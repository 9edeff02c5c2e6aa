from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import mul_add_params


class Linear(ActivationDesc):
    """DML_ACTIVATION_LINEAR_OPERATOR_DESC: Alpha * x + Beta.

    No current ONNX operator (the experimental Affine was removed before opset 10). DirectML documents
    no defaults; vkact takes Affine's, Alpha = 1 and Beta = 0.
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_LINEAR"] = "DML_OPERATOR_ACTIVATION_LINEAR"
    onnx_bfloat16: ClassVar[bool] = False  # no ONNX operator
    Alpha: Scalar = 1.0
    Beta: Scalar = 0.0

    shader: ClassVar[str] = "linear"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "Alpha * x + Beta"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return mul_add_params(self.Alpha, self.Beta)

    def formula(self, x: np.ndarray) -> np.ndarray:
        return self.Alpha * x + self.Beta
