from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import legacy_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import f32, softplus_params


class ParametricSoftplus(ActivationDesc):
    """DML_ACTIVATION_PARAMETRIC_SOFTPLUS_OPERATOR_DESC: Alpha * log(1 + exp(Beta * x)).

    No current ONNX operator (the experimental ParametricSoftplus, which had no defaults, was removed
    before opset 10). DirectML documents no defaults either; vkact takes Alpha = Beta = 1 (Softplus).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_PARAMETRIC_SOFTPLUS"] = "DML_OPERATOR_ACTIVATION_PARAMETRIC_SOFTPLUS"
    onnx_bfloat16: ClassVar[bool] = False  # no ONNX operator
    Alpha: Scalar = 1.0
    Beta: Scalar = 1.0

    shader: ClassVar[str] = "parametric_softplus"
    support: ClassVar = legacy_float()
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    formula_text: ClassVar[str] = "Alpha * log(1 + exp(Beta * x))"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return softplus_params(self.Beta, f32(self.Alpha), f32(self.Alpha) * f32(self.Beta))

    def formula(self, x: np.ndarray) -> np.ndarray:
        return self.Alpha * np.logaddexp(0.0, self.Beta * x)
