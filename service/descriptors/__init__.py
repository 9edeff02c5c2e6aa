"""DirectML's tensor descriptors, data types and feature levels; no kp, no HTTP."""
from .datatypes import DataType, DataTypeInfo
from .feature_levels import IMPLEMENTED_LEVEL, FeatureLevel, LevelSupport, TensorSupport
from .tensor import MAX_DIMS, TensorDesc, TensorFlags, calc_buffer_tensor_size, packed_strides

__all__ = [
    "DataType", "DataTypeInfo", "FeatureLevel", "IMPLEMENTED_LEVEL", "LevelSupport", "MAX_DIMS",
    "TensorDesc", "TensorFlags", "TensorSupport", "calc_buffer_tensor_size", "packed_strides",
]
