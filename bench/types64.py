"""The 64-bit kernels (FLOAT64, INT64, UINT64) against the copy shader on the same buffers: native
(shaderFloat64/shaderInt64, where the device reports them) and emulated in 32-bit words
(Settings.native_64bit=False), with SHRINK in FLOAT32 beside them. Tensors of 64 MiB on every device:
2^24 elements of 4 bytes, 2^23 of 8 (2^24 of 8 is 128 MiB, beyond lavapipe's maxStorageBufferRange
less the packed kernels' 16 bytes of slack)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.config import Settings
from service.descriptors import DataType
from service.engine import Engine
from service.operators import OperatorDesc, parse_operator

from .kernels import VkBench
from .timing import Samples, rounds

TENSOR_BYTES = 64 << 20
#: (label, operator, data type, extra fields): what a user of the 64-bit types runs.
CASES = [
    ("shrink", "SHRINK", DataType.FLOAT32, {}),
    ("shrink", "SHRINK", DataType.FLOAT64, {}),
    ("shrink", "SHRINK", DataType.INT64, {"Bias": 1.5, "Threshold": 2.0}),
    ("shrink", "SHRINK", DataType.UINT64, {"Bias": 1.5, "Threshold": 2.0}),
    ("relu", "RELU", DataType.INT64, {}),
    ("parameterized_relu", "PARAMETERIZED_RELU", DataType.INT64, {}),
    ("relu_grad", "RELU_GRAD", DataType.INT64, {}),
    ("hardmax1/1024", "HARDMAX1", DataType.FLOAT64, {"Axes": [1]}),
]


@dataclass
class Row:
    label: str
    dtype: DataType
    elements: int
    moved: int                          # bytes read and written by one dispatch
    paths: dict[str, tuple[Samples, Samples] | str]   # path -> (kernel, copy) samples, or why not run


def make(kind: str, dtype: DataType, elements: int, fields: dict) -> OperatorDesc:
    from service.operators import OPERATORS

    op = OPERATORS[f"DML_OPERATOR_ACTIVATION_{kind}"]
    sizes = [elements // 1024, 1024] if "Axes" in fields else [elements]
    tensor = {"DataType": dtype.value, "Sizes": sizes}
    return parse_operator({"Type": op.type_name(), **{f: tensor for f in op.input_fields}, **fields})


def inputs(dtype: DataType, n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    if dtype.info.is_integer:
        info = np.iinfo(dtype.info.numpy)
        return rng.integers(info.min, info.max, n, dtype=dtype.info.numpy, endpoint=True)
    return (rng.standard_normal(n) * 3).astype(dtype.info.numpy)


def measure(repeat: int, warmup: int) -> tuple[Engine, list[Row]]:
    engines = {"native": Engine(Settings(native_64bit=True)), "emulated": Engine(Settings(native_64bit=False))}
    rows: list[Row] = []
    try:
        for engine in engines.values():
            engine.load_shaders()
        benches = {path: VkBench(e) for path, e in engines.items()}
        device = engines["native"]
        for label, kind, dtype, fields in CASES:
            n = min(TENSOR_BYTES, device.max_tensor_bytes) // dtype.info.size
            op = make(kind, dtype, n, fields)
            x = inputs(dtype, n)
            row = Row(label, dtype, n, (len(op.inputs) + 1) * n * dtype.info.size, {})
            for path, engine in engines.items():
                define = op.served_types(engine.kernel_features)[dtype]
                if dtype.info.feature is None and path == "emulated":
                    continue   # a 32-bit type has one path
                if define is None or (path == "native" and define != dtype.info.shader):
                    row.paths[path] = "422" if define is None else "no native path on this device"
                    continue
                engine.execute(op, [x] * len(op.inputs))   # slot and pipeline, as a request makes them
                tasks = [(("copy",), benches[path].copy(op)), (("kernel",), benches[path].kernel(op))]
                got = rounds(tasks, warmup, repeat)
                row.paths[path] = (got[("kernel",)], got[("copy",)])
            rows.append(row)
    finally:
        for engine in engines.values():
            engine.close()
    return engines["native"], rows


def _cell(row: Row, path: str) -> list[str]:
    got = row.paths.get(path)
    if got is None:
        return ["—", "—"]
    if isinstance(got, str):
        return [got, "—"]
    kernel, copy = got
    copy_bytes = 2 * row.elements * row.dtype.info.size
    kernel_gbps = kernel.gbps(row.moved)
    return [f"{kernel_gbps:.2f} ({kernel.gbps(row.moved, median=True):.2f})", f"{kernel_gbps / copy.gbps(copy_bytes):.2f}"]


def section(device_name: str, header: list[tuple[str, str]], rows: list[Row]) -> str:
    lines = [f"<!-- types64: {device_name} -->", f"## {device_name}: 64-bit kernels, native and emulated", ""]
    lines += [f"- **{k}**: {v}" for k, v in header]
    lines += ["", "Kernel GB/s best (median) of the runs, bytes read and written; kernel / copy: against the copy "
              "shader's GB/s on the same buffers, run alternately with it. Native: the device's shaderFloat64/"
              "shaderInt64; emulated: 32-bit words (VKACT_NATIVE_64BIT=0, what a device without them runs).", "",
              "| operator | type | elements | native GB/s | native / copy | emulated GB/s | emulated / copy | emulated / native |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        native, emulated = _cell(row, "native"), _cell(row, "emulated")
        ratio = "—"
        if all(isinstance(row.paths.get(p), tuple) for p in ("native", "emulated")):
            ratio = f"{row.paths['native'][0].best / row.paths['emulated'][0].best:.2f}"   # type: ignore[index]
        lines.append(f"| `{row.label}` | {row.dtype.name} | 2^{row.elements.bit_length() - 1} | {' | '.join(native)} | {' | '.join(emulated)} | {ratio} |")
    return "\n".join(lines) + "\n\n<!-- end types64 -->\n"
