import math
from fractions import Fraction
from typing import ClassVar, Literal

import numpy as np

from ..descriptors import DataType
from ..descriptors.feature_levels import INTEGERS_SIGNED, INTEGERS_UNSIGNED, FeatureLevel, legacy_float, with_types
from .base import ActivationDesc, Scalar
from .numerics import f32, flush_subnormal


class Shrink(ActivationDesc):
    """DML_ACTIVATION_SHRINK_OPERATOR_DESC: x + Bias if x < -Threshold, x - Bias if x > Threshold, else 0.

    ONNX Shrink with bias = Bias and lambd = Threshold, tested in ONNX's order (x < -Threshold first),
    which decides a negative Threshold, where both conditions can hold. NaN gives 0 (every comparison
    is false).

    Integer tensors (DirectML from 5_1: INT8/16/32, UINT8/16/32): x is compared with Threshold exactly,
    x -/+ Bias is computed exactly, truncated toward zero and wrapped to the type (modulo 2^bits, two's
    complement), as ONNX's reference gives when it casts its float64 result back (uint8 3 - 5.5 = -2.5
    -> -2 -> 254). ONNX's reference rounds x -/+ Bias to float64 before truncating, and ONNX Runtime to
    float32; vkact does not round, which differs from them only when Bias has a fractional part below
    about 2^-20 of x (x - 2^-52 is x - 1 here, x there). INT64, UINT64 and FLOAT64, which ONNX
    also allows, run natively where the device has shaderInt64/shaderFloat64 and emulated in 32-bit
    words elsewhere (glsl/common/emu64.glsl): the same exact results. FLOAT64 computes with Bias and
    Threshold as the float32 values that DirectML's FLOAT gives (as ONNX's float attributes do).
    """

    Type: Literal["DML_OPERATOR_ACTIVATION_SHRINK"] = "DML_OPERATOR_ACTIVATION_SHRINK"
    onnx_bfloat16: ClassVar[bool] = False  # ONNX's Shrink has no bfloat16 (onnx.defs)
    Bias: Scalar = 0.0
    Threshold: Scalar = 0.5

    shader: ClassVar[str] = "shrink"
    support: ClassVar = with_types(legacy_float(FeatureLevel.FL_2_0), FeatureLevel.FL_5_1, INTEGERS_SIGNED | INTEGERS_UNSIGNED)
    extra_types: ClassVar = frozenset({DataType.INT64, DataType.UINT64, DataType.FLOAT64})
    emulated_types: ClassVar = frozenset({DataType.INT64, DataType.UINT64, DataType.FLOAT64})
    formula_text: ClassVar[str] = "x + Bias if x < -Threshold; x - Bias if x > Threshold; else 0"

    def formula(self, x: np.ndarray) -> np.ndarray:
        return np.where(x < -self.Threshold, x + self.Bias, np.where(x > self.Threshold, x - self.Bias, 0.0))

    def reference(self, x: np.ndarray) -> np.ndarray:
        """Integers by exact rational arithmetic (independent of the kernel's integer tricks)."""
        if x.dtype.kind not in "iu":
            return super().reference(x)
        threshold, bias = Fraction(f32(self.Threshold)), Fraction(f32(self.Bias))
        bits = 8 * x.dtype.itemsize

        def one(v: int) -> int:
            exact = v + bias if v < -threshold else v - bias if v > threshold else Fraction(0)
            return math.trunc(exact) % (1 << bits)

        return np.array([one(int(v)) for v in x.reshape(-1)], np.uint64).astype(x.dtype).reshape(x.shape)

    def shader_params(self) -> tuple:
        dtype = self.data_type.info
        if not dtype.is_integer:
            if dtype.size == 8:  # PARAM_F64(0), PARAM_F64(2)
                return tuple(np.float64(flush_subnormal(v)) for v in self.scalars())
            return self.scalars()
        info = np.iinfo(dtype.numpy)
        threshold, bias = float(np.float32(self.Threshold)), float(np.float32(self.Bias))
        low, high = math.ceil(-threshold) - 1, math.floor(threshold) + 1   # x < -T <=> x <= low; x > T <=> x >= high
        flags = (low >= info.max) | (low < info.min) << 1 | (high <= info.min) << 2 | (high > info.max) << 3
        words = [low, high, flags]
        for shift, c in ((4, -bias), (6, bias)):  # x + Bias = x - (-Bias); x - Bias
            ci = math.trunc(c)
            cf = c - ci
            words.append(ci)
            words[2] |= (1 if cf > 0 else 2 if cf < 0 else 0) << shift
        if dtype.size == 8:  # PARAM_U64(0, 2, 4, 6): low, high, ci of each branch; PARAM_UINT(8): flags
            return (*(np.uint64(w & 0xFFFFFFFFFFFFFFFF) for w in (words[0], words[1], words[3], words[4])), words[2])
        return tuple(w & 0xFFFFFFFF for w in (words[0], words[1], words[2], words[3], words[4]))
