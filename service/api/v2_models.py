"""The operators as Open Inference Protocol models, generated from the registry: one model per operator,
named ``short_name(op)`` ('shrink', 'scaled_tanh', ...), with one version, "1". Its inputs and output are
the descriptor's tensor fields (InputTensor, SlopeTensor, OutputTensor, ...) and its scalar fields travel
as request parameters, with DirectML's defaults."""
from __future__ import annotations

import json
from typing import Any, get_args, get_origin

from ..descriptors import DataType
from ..errors import UnknownOperator
from ..operators import OPERATORS, OperatorDesc, short_name
from .metrics import MODEL_VERSION

PLATFORM = "vkact_directml"

#: The protocol's tensor data types that name a DML_TENSOR_DATA_TYPE. INT64, UINT64 and FP64 are here
#: because the descriptor layer accepts them for some operators (and then says there is no kernel);
#: BF16 is vkact's BFLOAT16 (DirectML has none), for the operators ONNX defines bfloat16 for.
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
NOT_TENSOR_TYPES = ("BOOL", "BYTES")  # the protocol has them; DirectML's activations do not

#: Model metadata shows one variable dimension; any shape of 1 to 8 dimensions is accepted.
VARIABLE_SHAPE = [-1]

MODELS: dict[str, type[OperatorDesc]] = {short_name(op): op for op in OPERATORS.values()}


def param_fields(op: type[OperatorDesc]) -> tuple[str, ...]:
    """The fields a request sets through ``parameters`` (scalars, and arrays where an operator has them)."""
    fields = getattr(op, "param_fields", None)
    return fields() if fields is not None else op.scalar_fields()


def datatypes(op: type[OperatorDesc]) -> list[str]:
    """The protocol's names of the data types this operator runs on the device, FP32 first."""
    have = {t for t in op.accepted_types() if t.info.shader is not None}
    return [v2 for v2, dml in V2_TO_DML.items() if dml in have]


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


def metadata(op: type[OperatorDesc]) -> dict[str, Any]:
    """$metadata_model_response. The tensors show FP32, the default; ``parameters.datatypes`` lists every
    data type the model accepts, and the other parameters are the operator's fields with their defaults."""
    first = datatypes(op)[0]
    return {
        "name": short_name(op),
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [{"name": name, "datatype": first, "shape": VARIABLE_SHAPE} for name in op.input_fields],
        "outputs": [{"name": op.output_field, "datatype": first, "shape": VARIABLE_SHAPE}],
        "parameters": {"datatypes": ",".join(datatypes(op)), **_defaults(op)},
    }


def config(op: type[OperatorDesc]) -> dict[str, Any]:
    """A Triton model configuration, as much as perf_analyzer and Triton tooling read: no batching
    (max_batch_size 0), variable dimensions."""
    first = f"TYPE_{datatypes(op)[0]}"
    return {
        "name": short_name(op),
        "platform": PLATFORM,
        "backend": "vkact",
        "max_batch_size": 0,
        "version_policy": {"specific": {"versions": [int(MODEL_VERSION)]}},
        "input": [{"name": name, "data_type": first, "format": "FORMAT_NONE", "dims": VARIABLE_SHAPE} for name in op.input_fields],
        "output": [{"name": op.output_field, "data_type": first, "dims": VARIABLE_SHAPE}],
        "parameters": {name: {"string_value": str(value)} for name, value in _defaults(op).items()},
    }
