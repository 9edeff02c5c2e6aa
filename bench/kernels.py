"""vkact's side of the benchmark, on the engine's own objects: the pipeline and slot buffers that
``Engine.prepare`` gives (what ``execute`` dispatches), dispatched alone (kernel time) or through
``execute`` (end to end), and the copy shader bound to the same buffers with the same workgroup count
(the device's ceiling)."""
from __future__ import annotations

from collections.abc import Callable

import kp
import numpy as np

from service.descriptors import DataType
from service.dispatch_geometry import UNIT_BYTES
from service.engine import Engine
from service.operators import OPERATORS, OperatorDesc, parse_operator, short_name
from service.shaders import ShaderCompiler, Variant

# glsl/bench/copy.comp through the engine's compiler and cache; the defines are unused by the shader.
COPY_VARIANT = Variant("bench/copy", "F32", "PACKED")


def _registry() -> dict[str, type[OperatorDesc]]:
    return {short_name(op): op for op in OPERATORS.values()}


def operators(names: list[str] | None) -> list[str]:
    """Short names (``shrink``, ``scaled_tanh``) of the registered operators, or of those asked for."""
    known = sorted(_registry())
    unknown = set(names or ()) - set(known)
    if unknown:
        raise SystemExit(f"unknown operator(s) {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    return list(dict.fromkeys(names)) if names else known


#: Row lengths at which the softmax family is measured (rows = elements / row length).
ROW_LENGTHS = (1024, 65536)


def cases(names: list[str]) -> list[tuple[str, str, int | None]]:
    """(label, operator, row length): elementwise operators once, reductions once per row length."""
    out: list[tuple[str, str, int | None]] = []
    for name in names:
        if getattr(_registry()[name], "kind", "elementwise") == "elementwise":
            out.append((name, name, None))
        else:
            out += [(f"{name}/{row}", name, row) for row in ROW_LENGTHS]
    return out


def make_op(name: str, elements: int, row_len: int | None = None) -> OperatorDesc:
    """A packed FLOAT32 descriptor with DirectML's default parameters: 1-D, or rows of ``row_len``
    for a reduction; every input tensor alike."""
    op = _registry()[name]
    sizes = [elements] if row_len is None else [max(elements // row_len, 1), row_len]
    tensor = {"DataType": DataType.FLOAT32.value, "Sizes": sizes}
    return parse_operator({"Type": op.type_name(), **{field: tensor for field in op.input_fields}})


class VkBench:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._copy_spirv = ShaderCompiler(engine.settings).spirv(COPY_VARIANT)
        self._copies: dict[tuple[int, int], kp.Sequence] = {}

    def end_to_end(self, op: OperatorDesc, x: np.ndarray) -> Callable[[], np.ndarray]:
        """``execute`` as a caller sees it: copy in, dispatch, copy out into a new array."""
        inputs = [x] * len(op.inputs)
        return lambda: self.engine.execute(op, inputs)

    def kernel(self, op: OperatorDesc) -> Callable[[], object]:
        """The dispatch alone, on the pipeline and buffers that ``execute(op, ...)`` uses."""
        prepared = self.engine.prepare(op)
        seq = self.engine.sequence()
        seq.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
        return seq.eval

    def copy(self, op: OperatorDesc) -> Callable[[], object]:
        """The copy shader over op's input bytes, from op's first input buffer to its output buffer."""
        prepared = self.engine.prepare(op)
        capacity = prepared.slot.capacity
        units = -(-op.inputs[0].total_bytes // UNIT_BYTES)
        seq = self._copies.get((capacity, units))
        if seq is None:
            tensors = prepared.algorithm.get_tensors()  # inputs, output (, layout table)
            groups = self.engine.workgroups(capacity // UNIT_BYTES)
            algorithm = self.engine.algorithm([tensors[0], tensors[len(op.inputs)]], self._copy_spirv, groups, 1)
            seq = self._copies[(capacity, units)] = self.engine.sequence()
            seq.record(kp.OpAlgoDispatch(algorithm, np.array([units], np.uint32)))
        return seq.eval
