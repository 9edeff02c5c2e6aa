"""Run one DirectML descriptor's ONNX counterpart in ONNX Runtime (CPU) and in ONNX's reference evaluator."""
from __future__ import annotations

from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from service.operators import OperatorDesc

from .onnx_map import ONNX, OnnxCounterpart

_ELEM = {np.dtype(t): helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (
    np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)}


def model_for(op: OperatorDesc, dtype: np.dtype, shapes: list[tuple[int, ...]]) -> onnx.ModelProto:
    spec: OnnxCounterpart = ONNX[op.type_name()]
    names = ["X", *(f"X{i}" for i in range(1, len(shapes)))]
    attrs: dict = {onnx_name: float(np.float32(getattr(op, dml))) for onnx_name, dml in spec.attributes.items()}
    if spec.axis:
        (attrs["axis"],) = op.reduced_axes()  # type: ignore[attr-defined]
    node = helper.make_node(spec.op_type, names, ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, _ELEM[dtype], list(s)) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("Y", _ELEM[dtype], None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)])
    model.ir_version = 10
    return model


@cache
def _session(serialized: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])


def run_onnxruntime(model: onnx.ModelProto, *inputs: np.ndarray) -> np.ndarray:
    session = _session(model.SerializeToString())
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))[0]


def run_reference(model: onnx.ModelProto, *inputs: np.ndarray) -> np.ndarray:
    names = [i.name for i in model.graph.input]
    with np.errstate(all="ignore"):
        return np.asarray(ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0])
