"""The operators as Open Inference Protocol models, generated from the registry: one model per operator,
named ``short_name(op)`` ('shrink', 'scaled_tanh', ...), with one version, "1". Its inputs and output are
the descriptor's tensor fields (InputTensor, SlopeTensor, OutputTensor, ...) and its scalar fields travel
as request parameters, with DirectML's defaults."""
from __future__ import annotations

import json
import re
from typing import Any, get_args, get_origin

from ..descriptors import IMPLEMENTED_LEVEL, DataType
from ..errors import UnknownOperator
from ..operators import OPERATORS, OperatorDesc, short_name
from .metrics import MODEL_VERSION

PLATFORM = "vkact_directml"

#: The protocol's tensor data types that name a DML_TENSOR_DATA_TYPE; BF16 is vkact's BFLOAT16 (DirectML
#: has none), for the operators ONNX defines bfloat16 for.
V2_TO_DML: dict[str, DataType] = {
    "FP32": DataType.FLOAT32,
    "FP16": DataType.FLOAT16,
    "FP64": DataType.FLOAT64,
    "INT8": DataType.INT8,
    "INT16": DataType.INT16,
    "INT32": DataType.INT32,
    "INT64": DataType.INT64,
    "UINT8": DataType.UINT8,
    "UINT16": DataType.UINT16,
    "UINT32": DataType.UINT32,
    "UINT64": DataType.UINT64,
    "BF16": DataType.BFLOAT16,
}
DML_TO_V2: dict[DataType, str] = {dml: v2 for v2, dml in V2_TO_DML.items()}
#: The descriptor layer's data type names (DirectML's, and vkact's BFLOAT16), which oip_names rewrites.
_DML_NAME = re.compile(r"\b(?:DML|VKACT)_TENSOR_DATA_TYPE_[A-Z0-9]+\b")
NOT_TENSOR_TYPES = ("BOOL", "BYTES")  # the protocol has them; DirectML's activations do not

#: Model metadata shows one variable dimension; any shape of 1 to 8 dimensions is accepted (the
#: parameters say so: "dimension_counts").
VARIABLE_SHAPE = [-1]

MODELS: dict[str, type[OperatorDesc]] = {short_name(op): op for op in OPERATORS.values()}


def param_fields(op: type[OperatorDesc]) -> tuple[str, ...]:
    """The fields a request sets through ``parameters`` (scalars, and arrays where an operator has them)."""
    fields = getattr(op, "param_fields", None)
    return fields() if fields is not None else op.scalar_fields()


def datatypes(op: type[OperatorDesc], features: frozenset[str] | None = None) -> list[str]:
    """The protocol's names of the data types this operator accepts, FP32 first; given the device's
    kernel features (``kernel_features``), only those it runs there."""
    have = op.accepted_types() if features is None else {t for t, v in op.served_types(features).items() if v}
    return [v2 for v2, dml in V2_TO_DML.items() if dml in have]


def oip_names(message: str) -> str:
    """``message`` in the Open Inference Protocol's words, for the /v2 and gRPC answers: DirectML's
    data type names as the protocol's (DML_TENSOR_DATA_TYPE_INT32 -> INT32)."""
    def name(match: re.Match[str]) -> str:
        try:
            return DML_TO_V2.get(DataType(match[0]), match[0])
        except ValueError:
            return match[0]

    return _DML_NAME.sub(name, message)


def refused(op: type[OperatorDesc], features: frozenset[str]) -> dict[str, str]:
    """The accepted data types that this device has no kernel of ``op`` for: protocol name -> the
    device feature that it lacks."""
    return {DML_TO_V2[t]: t.info.feature or "" for t, v in op.served_types(features).items() if v is None}


def kernel_features(info: dict[str, Any] | None) -> frozenset[str] | None:
    """The device features the kernels use, from the device worker's ready report (None before it)."""
    return None if info is None else frozenset(info.get("kernel_features", ()))


def find_model(name: str, version: str | None = None) -> type[OperatorDesc]:
    op = MODELS.get(name)
    if op is None:
        raise UnknownOperator(f"unknown model {name!r}; the models are {', '.join(MODELS)}")
    if version is not None and version != MODEL_VERSION:
        raise UnknownOperator(f"model {name!r} has no version {version!r}; its only version is {MODEL_VERSION}")
    return op


def _param_value(value: Any) -> Any:
    """Parameters are strings, numbers or booleans in the protocol; anything else travels as JSON text."""
    return value if isinstance(value, (str, int, float, bool)) else json.dumps(value)


def is_array_param(op: type[OperatorDesc], name: str) -> bool:
    """An array field (Axes): the protocol's parameters are scalars, so it may also come as "0,2"."""
    annotation = op.model_fields[name].annotation
    return get_origin(annotation) in (tuple, list) or any(get_origin(a) in (tuple, list) for a in get_args(annotation))


def _defaults(op: type[OperatorDesc]) -> dict[str, Any]:
    """The optional parameters with their defaults; ``required`` names those without one (Axes)."""
    fields = [(name, op.model_fields[name]) for name in param_fields(op)]
    out = {name: _param_value(f.default) for name, f in fields if not f.is_required()}
    required = [name for name, f in fields if f.is_required()]
    return {**out, "required": ",".join(required)} if required else out


def served(op: type[OperatorDesc], features: frozenset[str] | None = None) -> dict[str, str]:
    """What a tensor's one datatype and shape cannot say: every data type the model runs on the device
    (every one it accepts until the device is known), FP32 first, ``datatypes_refused`` the accepted
    ones without a kernel here, each with the device feature it lacks, and the dimension counts it
    takes (any shape of those ranks)."""
    support = op.support.at(IMPLEMENTED_LEVEL)
    assert support is not None
    without = refused(op, features) if features is not None else {}
    extra = {"datatypes_refused": ",".join(f"{t} ({need})" for t, need in without.items())} if without else {}
    return {"datatypes": ",".join(datatypes(op, features)), **extra,
            "dimension_counts": f"{support.min_dims}-{support.max_dims}"}


def metadata(op: type[OperatorDesc], max_batch_size: int, features: frozenset[str] | None = None) -> dict[str, Any]:
    """$metadata_model_response. The tensors show FP32, the default, and one variable dimension (a
    batched model's leading one too, as Triton shows it); ``parameters`` says what they cannot (see
    ``served``), then the operator's fields with their defaults. gRPC's metadata has no parameters:
    the model's config carries the same (both protocols)."""
    first = datatypes(op)[0]
    shape = [-1, *VARIABLE_SHAPE] if max_batch_size > 0 else VARIABLE_SHAPE
    return {
        "name": short_name(op),
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [{"name": name, "datatype": first, "shape": shape} for name in op.input_fields],
        "outputs": [{"name": op.output_field, "datatype": first, "shape": shape}],
        "parameters": {**served(op, features), **_defaults(op)},
    }


def config(op: type[OperatorDesc], max_batch_size: int, dynamic_batching: bool,
           features: frozenset[str] | None = None) -> dict[str, Any]:
    """A Triton model configuration, as perf_analyzer and Triton tooling read it: the batching the
    device worker applies to this model (model_config), variable dimensions, and in ``parameters``
    the data types and dimension counts served and the operator's defaults."""
    first = f"TYPE_{datatypes(op)[0]}"
    out: dict[str, Any] = {
        "name": short_name(op),
        "platform": PLATFORM,
        "backend": "vkact",
        "max_batch_size": max_batch_size,
        "version_policy": {"specific": {"versions": [int(MODEL_VERSION)]}},
        "input": [{"name": name, "data_type": first, "format": "FORMAT_NONE", "dims": VARIABLE_SHAPE} for name in op.input_fields],
        "output": [{"name": op.output_field, "data_type": first, "dims": VARIABLE_SHAPE}],
        "parameters": {name: {"string_value": str(value)} for name, value in {**served(op, features), **_defaults(op)}.items()},
    }
    if dynamic_batching:  # it never waits: what queued while the device was busy runs together
        out["dynamic_batching"] = {"max_queue_delay_microseconds": 0}
    return out
