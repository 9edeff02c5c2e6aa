"""The examples of /openapi.json, so that Swagger's "Try it out" (/docs) sends requests that work as
they stand: a body for each POST route that takes one (for /v1/execute one per operator family, built
from the registry) and a value for each path parameter. tests/service/test_openapi.py posts each one.

Some routes answer as Triton does whatever the body: unload (the models are built in), CUDA
registration (no CUDA memory), the trace and log settings (not supported); their examples are the
requests a Triton client sends, answered with the documented refusal."""
from __future__ import annotations

import json
from typing import Any

from ..descriptors import DataType
from ..operators import OPERATORS, OperatorDesc
from ..dataplane.models import param_fields

MODEL = "celu"  # elementwise with a parameter: it shows parameters and takes a batching config
REGION = "example"
#: a POSIX shared memory object the register example names; a client creates it first (tritonclient's
#: shared_memory.create_shared_memory_region)
REGION_KEY = "/vkact_openapi_example"

PATH_PARAMETERS = {"model": MODEL, "version": "1", "name": REGION}

SIZES = [2, 3]
_DATA = [-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]


def _families() -> dict[str, type[OperatorDesc]]:
    """One operator per way a /v1 request is written: the first in the registry of each family."""
    found: dict[str, type[OperatorDesc]] = {}
    for op in OPERATORS.values():
        if op.kind == "reduction":
            family = "reduction over axes" if "Axes" in param_fields(op) else "reduction over the last axis"
        elif len(op.input_fields) > 1:
            family = "two inputs"
        else:
            family = "scalar parameters" if op.scalar_fields() else "no parameters"
        found.setdefault(family, op)
    return found


def execute_example(op: type[OperatorDesc]) -> dict[str, Any]:
    """A /v1/execute body for ``op``: 2x3 FP32 tensors, its scalar parameters at their defaults (shown,
    to be changed), Axes [1] where it takes axes."""
    tensor = {"DataType": DataType.FLOAT32.value, "Sizes": SIZES}
    operator: dict[str, Any] = {"Type": op.type_name(), **{name: tensor for name in op.input_fields}}
    for name in param_fields(op):
        operator[name] = [1] if name == "Axes" else op.model_fields[name].default
    inputs = {name: [v * (k + 1) for v in _DATA] for k, name in enumerate(op.input_fields)}
    return {"Operator": operator, "Inputs": inputs}


def graph_example() -> dict[str, Any]:
    """A /v1/execute body with a Graph: LINEAR -> SCALED_TANH -> SHRINK on a 2x3 FP32 input named "x",
    its output named "y" (one fused dispatch)."""
    tensor = {"DataType": DataType.FLOAT32.value, "Sizes": SIZES}
    nodes = [{"Type": "DML_OPERATOR_ACTIVATION_LINEAR", "Alpha": 2.0, "Beta": -0.5},
             {"Type": "DML_OPERATOR_ACTIVATION_SCALED_TANH", "Alpha": 1.5, "Beta": 0.75},
             {"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "Bias": 0.1, "Threshold": 0.5}]
    return {
        "Graph": {
            "InputCount": 1, "OutputCount": 1,
            "Nodes": [{"Operator": {**op, "InputTensor": tensor}, "Name": op["Type"].rsplit("_", 1)[-1].lower()} for op in nodes],
            "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}],
            "IntermediateEdges": [{"FromNodeIndex": i, "FromNodeOutputIndex": 0, "ToNodeIndex": i + 1, "ToNodeInputIndex": 0} for i in range(2)],
            "OutputEdges": [{"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"}],
        },
        "Inputs": {"x": _DATA},
    }


def _infer_example() -> dict[str, Any]:
    return {"inputs": [{"name": "InputTensor", "shape": SIZES, "datatype": "FP32", "data": _DATA}], "parameters": {"Alpha": 0.5}}


def bodies() -> dict[str, dict[str, Any]]:
    """OpenAPI path -> its request body's ``examples`` (name -> {summary, value})."""
    one = lambda summary, value: {summary: {"summary": summary, "value": value}}  # noqa: E731
    execute = {f"{family}: {op.type_name()}": {"summary": f"{family} ({op.type_name()})", "value": execute_example(op)}
               for family, op in _families().items()}
    execute["graph: LINEAR -> SCALED_TANH -> SHRINK"] = {"summary": "graph (DML_GRAPH_DESC): LINEAR -> SCALED_TANH -> SHRINK, fused",
                                                          "value": graph_example()}
    infer = one(f"{MODEL}, a 2x3 FP32 tensor, Alpha 0.5", _infer_example())
    return {
        "/v1/execute": execute,
        "/v2/models/{model}/infer": infer,
        "/v2/models/{model}/versions/{version}/infer": infer,
        "/v2/repository/index": one("only the ready models", {"ready": True}),
        "/v2/repository/models/{model}/load": one(
            "batch up to 4 queued requests (Triton's JSON model configuration, as a string)",
            {"parameters": {"config": json.dumps({"max_batch_size": 4, "dynamic_batching": {}})}}),
        "/v2/systemsharedmemory/region/{name}/register": one(
            f"64 bytes of the object {REGION_KEY} (create it first)", {"key": REGION_KEY, "offset": 0, "byte_size": 64}),
        "/v2/cudasharedmemory/region/{name}/register": one(
            "refused: vkact has no CUDA memory", {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}),
        "/v2/trace/setting": one("refused: vkact has no tracing", {"trace_level": ["TIMESTAMPS"]}),
        "/v2/models/{model}/trace/setting": one("refused: vkact has no tracing", {"trace_level": ["TIMESTAMPS"]}),
        "/v2/logging": one("refused: vkact has no dynamic logging", {"log_verbose_level": 1}),
    }
