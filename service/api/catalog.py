"""GET /v1/operators: the operator catalog, generated from the registry."""
from __future__ import annotations

from typing import Any

from ..descriptors import IMPLEMENTED_LEVEL
from ..descriptors.datatypes import NO_KERNEL
from ..operators import OPERATORS, OperatorDesc, short_name


def operator_entry(op: type[OperatorDesc]) -> dict[str, Any]:
    fields = []
    for name, f in op.model_fields.items():   # DirectML's field order
        if name not in op.param_fields() and name not in op.length_fields:
            continue
        if name in op.scalar_fields():
            fields.append({"name": name, "type": "float", "default": f.default})
        elif name in op.length_fields:   # AxisCount: the length of its array, which fills it in
            fields.append({"name": name, "type": "uint", "default": None})
        else:                            # Axes
            fields.append({"name": name, "type": "uint[]", "default": f.default, "description": f.description})
    return {
        "type": op.type_name(),
        "name": short_name(op),
        "description": (op.__doc__ or "").strip().splitlines()[0],
        "formula": op.formula_text,
        "inputs": list(op.input_fields),
        "output": op.output_field,
        "fields": fields,
        "introduced": op.support.introduced.value,
        "in_place": op.in_place,
        "kind": op.kind,
        "support": [
            {
                "feature_level": step.level.value,
                "dimension_counts": [step.min_dims, step.max_dims],
                "data_types": sorted(t.value for t in step.data_types),
            }
            for step in op.support.steps
        ],
        "data_types_on_device": sorted(
            t.value for t in op.accepted_types() if t.info.shader
        ),
        # accepted (ONNX's types beyond DirectML's) but with no kernel on this build, and why
        "data_types_without_kernel": [
            {"data_type": t.value, "reason": NO_KERNEL} for t in sorted(op.accepted_types(), key=lambda t: t.value) if not t.info.shader
        ],
    }


def catalog() -> dict[str, Any]:
    return {
        "feature_level": IMPLEMENTED_LEVEL.value,
        "operators": [operator_entry(op) for op in OPERATORS.values()],
    }
