"""What every operator descriptor shares: tensor fields, DirectML's shape rules, the float64 reference.

An operator module declares only its DirectML fields (names, order, defaults), its shader, its tensor
support per feature level and its formula in numpy. Scalar fields are packed into the shader's push
constants in declaration order, so a shader reads PARAM(i) in the order of the DirectML struct.
"""
from __future__ import annotations

import functools
from enum import Enum
from typing import Annotated, ClassVar, Optional

import numpy as np
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, model_validator

from ..descriptors import DataType, FeatureLevel, TensorDesc, TensorSupport, packed_strides
from ..descriptors.canonical import CanonicalModel
from ..descriptors.feature_levels import IMPLEMENTED_LEVEL
from client.json_values import BFLOAT16, float64_to_bfloat16

from .numerics import finite_float32, flush_subnormal
from ..errors import DescriptorError, UnsupportedOnDevice

#: The FLOAT64 that the float operators accept beyond DirectML (ONNX defines double for them).
FLOAT64_ONLY = frozenset({DataType.FLOAT64})


def _not_a_boolean(value: object) -> object:
    """pydantic reads true as 1.0; tensor data refuses booleans, and a scalar does too (numeric text stays:
    gRPC's InferParameter has no double, so clients send a fraction as its text)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


#: A scalar parameter: DirectML's FLOAT, which must be a finite number here, and one as a float32.
Scalar = Annotated[float, BeforeValidator(_not_a_boolean), Field(allow_inf_nan=False), AfterValidator(finite_float32)]


class OperatorDesc(CanonicalModel):
    """Base of every DML_*_OPERATOR_DESC model. Subclasses add ``Type`` and their fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shader: ClassVar[str]                  # glsl/<shader>.comp
    kernels: ClassVar[tuple[str, ...]] = ()  # all its shaders, when kernel() picks one per descriptor
    kind: ClassVar[str] = "elementwise"    # the kernel contract: "elementwise" or "reduction" (see engine)
    support: ClassVar[TensorSupport]       # dimension counts and data types per feature level
    in_place: ClassVar[bool] = True        # DirectML's DML_SCHEMA_OPERATOR_SUPPORT_FLAG_IN_PLACE
    input_fields: ClassVar[tuple[str, ...]] = ("InputTensor",)
    output_field: ClassVar[str] = "OutputTensor"
    formula_text: ClassVar[str] = ""
    length_fields: ClassVar[tuple[str, ...]] = ()  # UINT counts of an array field (AxisCount): implied by it

    @classmethod
    def type_name(cls) -> str:
        return _type_name(cls)

    @classmethod
    def scalar_fields(cls) -> tuple[str, ...]:
        return tuple(name for name, f in cls.model_fields.items() if f.annotation is float)

    @classmethod
    def param_fields(cls) -> tuple[str, ...]:
        """The fields a caller sets besides the tensors, in DirectML order: scalars, and arrays such as
        Axes; the count fields that only give an array's length (AxisCount) are left out."""
        tensors = {*cls.input_fields, cls.output_field, "Type", *cls.length_fields}
        return tuple(name for name in cls.model_fields if name not in tensors)

    @property
    def inputs(self) -> tuple[TensorDesc, ...]:
        return tuple(getattr(self, name) for name in self.input_fields)

    @property
    def output(self) -> TensorDesc:
        return getattr(self, self.output_field)

    @property
    def data_type(self) -> DataType:
        return self.inputs[0].DataType

    @property
    def concatenable(self) -> bool:
        """Executions of equal descriptors can run as one, their buffers end to end: an elementwise
        operator whose tensors are all packed, of one shape, with no padding at the end (the device
        worker's batching; see ``concatenated``)."""
        if self.kind != "elementwise":
            return False
        tensors = (*self.inputs, self.output)
        return all(
            t.Sizes == self.output.Sizes and t.strides == packed_strides(t.Sizes) and t.total_bytes == t.element_count * t.DataType.info.size
            for t in tensors
        )

    def concatenated(self, n: int) -> OperatorDesc:
        """This (concatenable) descriptor over ``n`` executions' buffers end to end: every tensor 1-D."""
        sizes = (n * self.output.element_count,)
        return self.model_copy(update={name: getattr(self, name).like(Sizes=sizes, Strides=None) for name in (*self.input_fields, self.output_field)})

    def scalars(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, name)) for name in self.scalar_fields())

    @classmethod
    def all_kernels(cls) -> tuple[str, ...]:
        return cls.kernels or (cls.shader,)

    def kernel(self) -> str:
        """The shader this descriptor runs; an operator whose parameters call for different code
        (CELU's sign of Alpha) overrides it, which beats a branch that lavapipe would run both ways."""
        return self.shader

    def shader_params(self) -> tuple:
        """The kernel's PARAM(0..5): the scalar fields in order, unless the shader wants derived values;
        FLOAT64 kernels get them as doubles (float64_params)."""
        return self.float64_params() if self.data_type is DataType.FLOAT64 else self.scalars()

    def float64_params(self) -> tuple[np.float64, ...]:
        """A FLOAT64 kernel's PARAM_F64(0), PARAM_F64(2), ...: the scalar fields in order as doubles, of
        the float32 values that DirectML's FLOAT (and ONNX's float attributes) give them, which is
        what the reference computes with (``reference``)."""
        return tuple(np.float64(flush_subnormal(v)) for v in self.scalars())

    def formula(self, *xs: np.ndarray) -> np.ndarray:
        """The operator's maths on float64 arrays (the test oracle)."""
        raise TypeError(f"{type(self).__name__} defines no formula")  # a test checks every registered one does

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The numpy reference: compute in float64, cast back to the input's dtype. Scalar fields are
        DirectML FLOATs, so the reference uses them as the device gets them: rounded to float32, a
        subnormal one as zero (numerics.flush_subnormal)."""
        dtype = inputs[0].dtype
        as_float32 = {name: flush_subnormal(getattr(self, name)) for name in self.scalar_fields()}
        model = self.model_copy(update=as_float32)
        with np.errstate(all="ignore"):  # overflow to inf, NaN from NaN: both intended
            result = np.asarray(model.formula(*(np.asarray(x, dtype=np.float64) for x in inputs)), dtype=np.float64)
            if dtype.kind in "iu":  # truncate toward zero, then wrap to the type (modulo 2^bits)
                return np.trunc(result).astype(np.int64).astype(dtype)
            if dtype == BFLOAT16:  # one rounding from float64 (ml_dtypes' cast rounds through float32 first)
                return float64_to_bfloat16(result).view(dtype)
            return result.astype(dtype)

    @model_validator(mode="after")
    def _shape_rules(self) -> OperatorDesc:
        first_name = self.input_fields[0]
        first = getattr(self, first_name)
        if getattr(self, self.output_field) is None:
            # DirectML requires it; vkact takes the input's layout, packed where two of the input's elements
            # share a position (a broadcast, overlapping strides), which an output's must not
            default = first.like(Strides=None) if first.overlaps() else first
            object.__setattr__(self, self.output_field, default)
        for name in (*self.input_fields[1:], self.output_field):
            other: TensorDesc = getattr(self, name)
            for field in ("DataType", "DimensionCount", "Sizes"):
                if getattr(other, field) != getattr(first, field):
                    raise DescriptorError(
                        f"{name}.{field}",
                        f"{name}.{field} must equal {first_name}.{field} "
                        f"({_shown(getattr(first, field))}), got {_shown(getattr(other, field))}",
                    )
        dtype = first.DataType
        accepted = self.accepted_types()
        if dtype not in accepted:
            allowed = ", ".join(sorted(t.value for t in accepted))
            raise DescriptorError(f"{first_name}.DataType", f"{self.type_name()} does not support {dtype.value}; it supports {allowed}")
        if self.output.overlaps():
            raise DescriptorError(f"{self.output_field}.Strides", "output strides make two elements share one position")
        return self

    extra_types: ClassVar[frozenset[DataType]] = frozenset()  # accepted beyond DirectML (ONNX's types)
    # The 64-bit types whose emulated variant (DTYPE_*_EMU, 32-bit words) its shader has: served on a
    # device without the native variant's feature (datatypes.py DataTypeInfo.variant).
    emulated_types: ClassVar[frozenset[DataType]] = frozenset()
    #: ONNX defines its counterpart for bfloat16 (onnx.defs type constraints; tests/conformance checks):
    #: BFLOAT16 is then accepted with FLOAT32, stored as bfloat16, computed in float32.
    onnx_bfloat16: ClassVar[bool] = True

    @classmethod
    def accepted_types(cls) -> frozenset[DataType]:
        step = cls.support.at(IMPLEMENTED_LEVEL)
        types = (step.data_types if step else frozenset()) | cls.extra_types
        return types | {DataType.BFLOAT16} if cls.onnx_bfloat16 and DataType.FLOAT32 in types else types

    @classmethod
    def served_types(cls, features: frozenset[str]) -> dict[DataType, str | None]:
        """Each accepted type's shader variant (DTYPE_* define) on a device whose kernels may use
        ``features``, or None where it has none there (DataTypeInfo.missing says why)."""
        return {t: t.info.variant(features, t in cls.emulated_types) for t in sorted(cls.accepted_types(), key=list(DataType).index)}

    def shader_dtype(self, features: frozenset[str]) -> str:
        """The DTYPE_* define of the variant this descriptor runs; UnsupportedOnDevice (422) naming the
        missing device feature where the device has none."""
        info = self.data_type.info
        define = info.variant(features, self.data_type in self.emulated_types)
        if define is None:
            raise UnsupportedOnDevice(f"{self.type_name()} in {self.data_type.value}: {info.missing()}", f"{self.input_fields[0]}.DataType")
        return define

    def check_execution(self, in_place: bool, max_tensor_bytes: int) -> None:
        """The rules of one execution on one device: buffer sizes within the device's binding limit,
        and for in-place execution an output that can be the input buffer."""
        for name in (*self.input_fields, self.output_field):
            desc: TensorDesc = getattr(self, name)
            if desc.total_bytes > max_tensor_bytes:
                raise UnsupportedOnDevice(
                    f"{name} is {desc.total_bytes} bytes; this device binds at most {max_tensor_bytes} bytes per tensor",
                    f"{name}.TotalTensorSizeInBytes",
                )
        if not in_place:
            return
        source, out = self.inputs[0], self.output
        if not self.in_place:
            raise DescriptorError("InPlace", f"{self.type_name()} does not support in-place execution")
        if out.strides != source.strides or out.total_bytes != source.total_bytes:
            raise DescriptorError(self.output_field, "in place, OutputTensor must have InputTensor's Strides and TotalTensorSizeInBytes")
        if source.broadcasts:
            raise DescriptorError(f"{self.input_fields[0]}.Strides", "in place, the input cannot broadcast (zero strides)")

    def check_feature_level(self, level: FeatureLevel) -> None:
        """Apply DirectML's constraints at ``level`` (for requests that pin a FeatureLevel)."""
        step = self.support.at(level)
        if step is None:
            raise DescriptorError("FeatureLevel", f"{self.type_name()} was introduced at {self.support.introduced.value}, after {level.value}")
        for name in (*self.input_fields, self.output_field):
            tensor: TensorDesc = getattr(self, name)
            if not step.min_dims <= len(tensor.Sizes) <= step.max_dims:
                dims = f"{step.min_dims}" if step.min_dims == step.max_dims else f"{step.min_dims} to {step.max_dims}"
                raise DescriptorError(
                    f"{name}.DimensionCount",
                    f"{self.type_name()} takes {dims} dimensions at {level.value}, got {len(tensor.Sizes)}",
                )
            if tensor.DataType not in step.data_types:
                raise DescriptorError(f"{name}.DataType", f"{self.type_name()} does not take {tensor.DataType.value} at {level.value}")
            if 0 in tensor.Sizes:
                raise DescriptorError(f"{name}.Sizes", "DirectML does not allow a size of 0")


@functools.cache
def _type_name(cls: type[OperatorDesc]) -> str:
    # Read once per class: pydantic's model_fields goes through a descriptor on every access.
    return cls.model_fields["Type"].default


class ActivationDesc(OperatorDesc):
    """The common shape of DML_ACTIVATION_*_OPERATOR_DESC: one input and one output. OutputTensor may be
    omitted: it then is the InputTensor's descriptor (packed instead, where the input's elements share positions)."""

    InputTensor: TensorDesc
    OutputTensor: Optional[TensorDesc] = None


def _shown(value: object) -> object:
    """A field's value as a request writes it: an enum's value (DML_TENSOR_DATA_TYPE_FLOAT32), not its repr."""
    return value.value if isinstance(value, Enum) else value
