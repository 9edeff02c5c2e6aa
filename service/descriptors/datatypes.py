"""DML_TENSOR_DATA_TYPE: the one table that maps wire names to numpy dtypes, sizes and shader variants.

Nothing else in the project compares data-type strings; look a type up here.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from client.json_values import BFLOAT16 as _BFLOAT16


class DataType(str, Enum):
    """DML_TENSOR_DATA_TYPE, by its DirectML name (the JSON value)."""

    FLOAT32 = "DML_TENSOR_DATA_TYPE_FLOAT32"
    FLOAT16 = "DML_TENSOR_DATA_TYPE_FLOAT16"
    UINT32 = "DML_TENSOR_DATA_TYPE_UINT32"
    UINT16 = "DML_TENSOR_DATA_TYPE_UINT16"
    UINT8 = "DML_TENSOR_DATA_TYPE_UINT8"
    INT32 = "DML_TENSOR_DATA_TYPE_INT32"
    INT16 = "DML_TENSOR_DATA_TYPE_INT16"
    INT8 = "DML_TENSOR_DATA_TYPE_INT8"
    FLOAT64 = "DML_TENSOR_DATA_TYPE_FLOAT64"
    UINT64 = "DML_TENSOR_DATA_TYPE_UINT64"
    INT64 = "DML_TENSOR_DATA_TYPE_INT64"
    #: Not DirectML's (DirectML has no bfloat16): vkact's name for ONNX's bfloat16 on /v1 (/v2: BF16).
    BFLOAT16 = "VKACT_TENSOR_DATA_TYPE_BFLOAT16"

    @property
    def info(self) -> DataTypeInfo:
        return _INFO[self]

    @property
    def short(self) -> str:
        return self.name

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DataType:
        dt = np.dtype(dtype)
        for member, info in _INFO.items():
            if info.numpy == dt:
                return member
        raise ValueError(f"numpy dtype {dt} has no DML_TENSOR_DATA_TYPE")


@dataclass(frozen=True)
class DataTypeInfo:
    dml_value: int | None  # the enum's value in DirectML.h; None: not a DirectML type
    numpy: np.dtype
    size: int             # bytes per element
    shader: str           # the DTYPE_* define of the (native) shader variant (glsl/common/dtype.glsl)
    feature: str | None = None   # the VkPhysicalDeviceFeatures member the native variant needs
    emulated: str | None = None  # the DTYPE_* define of the variant that needs no feature (32-bit words)

    @property
    def is_integer(self) -> bool:
        return self.numpy.kind in "iu"

    def variant(self, features: frozenset[str], emulated: bool) -> str | None:
        """The shader variant for a device whose kernels may use ``features`` (enabled and allowed,
        see Engine.kernel_features), given whether the operator's shader has the emulated variant;
        None: no kernel on this device (``missing`` says why)."""
        if self.feature is None or self.feature in features:
            return self.shader
        return self.emulated if emulated else None

    def missing(self) -> str:
        """Why a device without ``feature`` has no kernel of this type for an operator without the
        emulated variant."""
        return f"{self.numpy.name} arithmetic in a shader needs the Vulkan device feature {self.feature}, which this device does not report (or VKACT_NATIVE_64BIT=0 turned off)"


_INFO: dict[DataType, DataTypeInfo] = {
    DataType.FLOAT32: DataTypeInfo(1, np.dtype("<f4"), 4, "F32"),
    DataType.FLOAT16: DataTypeInfo(2, np.dtype("<f2"), 2, "F16"),
    DataType.UINT32: DataTypeInfo(3, np.dtype("<u4"), 4, "U32"),
    DataType.UINT16: DataTypeInfo(4, np.dtype("<u2"), 2, "U16"),
    DataType.UINT8: DataTypeInfo(5, np.dtype("u1"), 1, "U8"),
    DataType.INT32: DataTypeInfo(6, np.dtype("<i4"), 4, "I32"),
    DataType.INT16: DataTypeInfo(7, np.dtype("<i2"), 2, "I16"),
    DataType.INT8: DataTypeInfo(8, np.dtype("i1"), 1, "I8"),
    DataType.FLOAT64: DataTypeInfo(9, np.dtype("<f8"), 8, "F64", "shaderFloat64", "F64_EMU"),
    DataType.UINT64: DataTypeInfo(10, np.dtype("<u8"), 8, "U64", "shaderInt64", "U64_EMU"),
    DataType.INT64: DataTypeInfo(11, np.dtype("<i8"), 8, "I64", "shaderInt64", "I64_EMU"),
    DataType.BFLOAT16: DataTypeInfo(None, _BFLOAT16, 2, "BF16"),  # ml_dtypes.bfloat16 (a service dependency)
}

#: The device features that vkact's kernels use where the device reports them (the patched kp enables
#: exactly these, scripts/build-kp.sh): the native 64-bit variants.
KERNEL_FEATURES = ("shaderFloat64", "shaderInt64")
