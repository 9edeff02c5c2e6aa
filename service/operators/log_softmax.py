from typing import ClassVar, Literal

import numpy as np

from .reduction import AxesReduction, LastAxisReduction, log_softmax


class LogSoftmax(LastAxisReduction):
    """DML_ACTIVATION_LOG_SOFTMAX_OPERATOR_DESC: x - max - log(sum(exp(x - max))) along the last dimension
    of an input of effective rank at most 2. ONNX LogSoftmax-1/11 (after coercion to 2-D)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_LOG_SOFTMAX"] = "DML_OPERATOR_ACTIVATION_LOG_SOFTMAX"

    shader: ClassVar[str] = "log_softmax"
    formula_text: ClassVar[str] = "x - max - log(sum(exp(x - max))), along the last dimension"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return log_softmax(x, self.reduced_axes())


class LogSoftmax1(AxesReduction):
    """DML_ACTIVATION_LOG_SOFTMAX1_OPERATOR_DESC: x - max - log(sum(exp(x - max))), max and sum jointly
    over Axes. ONNX LogSoftmax-13 (Axes = {axis})."""

    Type: Literal["DML_OPERATOR_ACTIVATION_LOG_SOFTMAX1"] = "DML_OPERATOR_ACTIVATION_LOG_SOFTMAX1"

    shader: ClassVar[str] = "log_softmax"
    formula_text: ClassVar[str] = "x - max - log(sum(exp(x - max))), over Axes"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return log_softmax(x, self.reduced_axes())
