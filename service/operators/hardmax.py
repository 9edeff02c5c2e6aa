from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from .reduction import AxesReduction, LastAxisReduction, hardmax


class Hardmax(LastAxisReduction):
    """DML_ACTIVATION_HARDMAX_OPERATOR_DESC: 1 at the first maximum along the last dimension of an input
    of effective rank at most 2, 0 elsewhere; a row holding NaN gets its 1 at the first NaN (numpy's
    argmax, as ONNX's reference Hardmax). ONNX Hardmax-1/11 (after coercion to 2-D)."""

    Type: Literal["DML_OPERATOR_ACTIVATION_HARDMAX"] = "DML_OPERATOR_ACTIVATION_HARDMAX"

    shader: ClassVar[str] = "hardmax"
    extra_types: ClassVar = frozenset({DataType.FLOAT64})   # ONNX's double; native only (shaderFloat64)
    formula_text: ClassVar[str] = "1 at the first maximum along the last dimension, else 0"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return hardmax(x, self.reduced_axes())


class Hardmax1(AxesReduction):
    """DML_ACTIVATION_HARDMAX1_OPERATOR_DESC: 1 at the first maximum over Axes (the reduced axes flattened
    in dimension order; the first NaN if there is one), 0 elsewhere: DirectML's ReduceArgMax
    (increasing) compared with the coordinate. ONNX Hardmax-13 (Axes = {axis})."""

    Type: Literal["DML_OPERATOR_ACTIVATION_HARDMAX1"] = "DML_OPERATOR_ACTIVATION_HARDMAX1"

    shader: ClassVar[str] = "hardmax"
    extra_types: ClassVar = frozenset({DataType.FLOAT64})
    formula_text: ClassVar[str] = "1 at the first maximum over Axes, else 0"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return hardmax(x, self.reduced_axes())
