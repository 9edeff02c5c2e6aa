from typing import ClassVar, Literal, Optional

import numpy as np

from ..descriptors import TensorDesc
from ..descriptors.feature_levels import legacy_float
from .base import OperatorDesc


class ParameterizedRelu(OperatorDesc):
    """DML_ACTIVATION_PARAMETERIZED_RELU_OPERATOR_DESC: x if x >= 0, else SlopeTensor * x.

    ONNX PRelu. DirectML requires SlopeTensor to have the input's Sizes; ONNX's broadcasting slope is
    expressed with zero strides (a per-channel slope of an NCHW input: Strides {0, 1, 0, 0}).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"] = "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"
    InputTensor: TensorDesc
    SlopeTensor: TensorDesc
    OutputTensor: Optional[TensorDesc] = None

    shader: ClassVar[str] = "parameterized_relu"
    support: ClassVar = legacy_float()
    input_fields: ClassVar[tuple[str, ...]] = ("InputTensor", "SlopeTensor")
    formula_text: ClassVar[str] = "x if x >= 0; else SlopeTensor * x"

    def formula(self, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, x, slope * x)
