from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import FeatureLevel, modern_float
from .base import FLOAT64_ONLY, ActivationDesc, Scalar
from .numerics import mul_add_params


class HardSwish(ActivationDesc):
    """DML_ACTIVATION_HARD_SWISH_OPERATOR_DESC: x * max(0, min(Alpha * x + Beta, 1)). ONNX HardSwish.

    The defaults are ONNX HardSwish's fixed alpha = 1/6 and beta = 0.5 (DirectML documents Alpha as
    0.166667; 1/6 is the float32 nearest to one sixth). Where the clamp gives 0 the result is 0, also
    for x = -inf (the limit; x * 0 would be NaN). Not in place: DirectMLSchema.h flags HARD_SWISH
    without DML_SCHEMA_OPERATOR_SUPPORT_FLAG_IN_PLACE (its documentation page says in-place works).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_HARD_SWISH"] = "DML_OPERATOR_ACTIVATION_HARD_SWISH"
    Alpha: Scalar = 1.0 / 6.0
    Beta: Scalar = 0.5

    shader: ClassVar[str] = "hard_swish"
    support: ClassVar = modern_float(FeatureLevel.FL_6_2)
    extra_types: ClassVar = FLOAT64_ONLY  # beyond DirectML: ONNX's double (glsl/common/f64math.glsl)
    in_place: ClassVar[bool] = False
    formula_text: ClassVar[str] = "x * max(0, min(Alpha * x + Beta, 1))"

    def shader_params(self) -> tuple[float, ...]:
        if self.data_type is DataType.FLOAT64:
            return self.float64_params()
        return mul_add_params(self.Alpha, self.Beta)

    def formula(self, x: np.ndarray) -> np.ndarray:
        h = np.maximum(0.0, np.minimum(self.Alpha * x + self.Beta, 1.0))
        return np.where(h == 0.0, 0.0, x * h)
