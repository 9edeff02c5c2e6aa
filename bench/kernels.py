"""vkact's side of the benchmark, on the engine's own objects: the pipeline and slot buffers that
``Engine.execute`` created, dispatched alone (kernel time) or through ``execute`` (end to end), and the
copy shader bound to the same buffers with the same workgroup count (the device's ceiling).

It reaches into Engine's private state (``_algorithms``, ``_mgr``) because the engine has no public
way to dispatch a prepared kernel without its transfers."""
from __future__ import annotations

from collections.abc import Callable

import kp
import numpy as np

from service.descriptors import DataType
from service.engine import UNIT_BYTES, Engine, _words, bucket
from service.layout import Layout, coalesce
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


def make_op(name: str, elements: int) -> OperatorDesc:
    """A packed 1-D FLOAT32 descriptor with DirectML's default parameters."""
    tensor = {"DataType": DataType.FLOAT32.value, "Sizes": [elements]}
    return parse_operator({"Type": _registry()[name].type_name(), "InputTensor": tensor})


class VkBench:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._copy_spirv = ShaderCompiler(engine.settings).spirv(COPY_VARIANT)
        self._copies: dict[tuple[int, int], kp.Sequence] = {}

    def end_to_end(self, op: OperatorDesc, x: np.ndarray) -> Callable[[], np.ndarray]:
        """``execute`` as a caller sees it: copy in, dispatch, copy out into a new array."""
        return lambda: self.engine.execute(op, [x])

    def kernel(self, op: OperatorDesc) -> Callable[[], object]:
        """The dispatch alone, on the pipeline and buffers that a prior ``execute(op, ...)`` created."""
        algorithm, layout = self._algorithm(op)
        seq = self.engine._mgr.sequence()
        seq.record(kp.OpAlgoDispatch(algorithm, _words([layout.count, len(layout.sizes), *op.shader_params()])))
        return seq.eval

    def copy(self, op: OperatorDesc) -> Callable[[], object]:
        """The copy shader over op's input bytes, from op's input buffer to its output buffer."""
        e = self.engine
        capacity = _capacity(op)
        units = -(-op.inputs[0].total_bytes // UNIT_BYTES)
        seq = self._copies.get((capacity, units))
        if seq is None:
            # The engine's workgroup count for a packed slot of this capacity (see Engine._algorithm).
            per_group = e.settings.local_size * e.units_per_invocation
            groups = max(1, min(-(-(capacity // UNIT_BYTES) // per_group), e.max_workgroups))
            tensors = self._algorithm(op)[0].get_tensors()  # [in0, out]
            spec = np.array([e.settings.local_size], np.uint32)
            algorithm = e._mgr.algorithm(tensors, self._copy_spirv, (groups, 1, 1), spec, np.array([units], np.uint32))
            seq = self._copies[(capacity, units)] = e._mgr.sequence()
            seq.record(kp.OpAlgoDispatch(algorithm))
        return seq.eval

    def _algorithm(self, op: OperatorDesc) -> tuple[kp.Algorithm, Layout]:
        """The pipeline Engine.execute built for op (the same key as Engine.execute/_algorithm)."""
        layout = coalesce((*op.inputs, op.output))
        variant = Variant(op.shader, op.data_type.info.shader or "", layout.kind, len(op.inputs))
        return self.engine._algorithms[(variant, _capacity(op), False)], layout


def _capacity(op: OperatorDesc) -> int:
    return bucket(max(d.total_bytes for d in (*op.inputs, op.output)) + UNIT_BYTES)
