from typing import ClassVar, Literal

import numpy as np

from .reduction import AxesReduction, LastAxisReduction, softmax


class Softmax(LastAxisReduction):
    """DML_ACTIVATION_SOFTMAX_OPERATOR_DESC: exp(x - max) / sum(exp(x - max)) along the last dimension of
    an input of effective rank at most 2. ONNX Softmax-1/11 (after coercion to 2-D)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_SOFTMAX"] = "DML_OPERATOR_ACTIVATION_SOFTMAX"

    shader: ClassVar[str] = "softmax"
    formula_text: ClassVar[str] = "exp(x - max) / sum(exp(x - max)), along the last dimension"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return softmax(x, self.reduced_axes())


class Softmax1(AxesReduction):
    """DML_ACTIVATION_SOFTMAX1_OPERATOR_DESC: exp(x - max) / sum(exp(x - max)), max and sum jointly over
    Axes. ONNX Softmax-13 (Axes = {axis})."""

    Type: Literal["DML_OPERATOR_ACTIVATION_SOFTMAX1"] = "DML_OPERATOR_ACTIVATION_SOFTMAX1"

    shader: ClassVar[str] = "softmax"
    formula_text: ClassVar[str] = "exp(x - max) / sum(exp(x - max)), over Axes"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return softmax(x, self.reduced_axes())
