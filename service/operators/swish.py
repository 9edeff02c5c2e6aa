from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import FeatureLevel, modern_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import scale_params
from .sigmoid import sigmoid


class Swish(ActivationDesc):
    """DML_ACTIVATION_SWISH_OPERATOR_DESC: x * sigmoid(SigmoidInputScale * x). ONNX Swish (alpha = SigmoidInputScale).

    Where sigmoid(SigmoidInputScale * x) is 0 the result is 0, also for an infinite x (the limit;
    x * 0 would be NaN). Not in place: DirectMLSchema.h flags SWISH without
    DML_SCHEMA_OPERATOR_SUPPORT_FLAG_IN_PLACE (its documentation page says in-place works).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SWISH"] = "DML_OPERATOR_ACTIVATION_SWISH"
    SigmoidInputScale: Scalar = 1.0

    shader: ClassVar[str] = "swish"
    support: ClassVar = modern_float(FeatureLevel.FL_6_2)
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    in_place: ClassVar[bool] = False
    formula_text: ClassVar[str] = "x * sigmoid(SigmoidInputScale * x)"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return scale_params(self.SigmoidInputScale)

    def formula(self, x: np.ndarray) -> np.ndarray:
        s = sigmoid(self.SigmoidInputScale * x)
        return np.where(s == 0.0, 0.0, x * s)
