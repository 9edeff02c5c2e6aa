"""GET /v1/operators: the operator catalog, generated from the registry."""
from __future__ import annotations

from typing import Any

from ...descriptors import IMPLEMENTED_LEVEL
from ...operators import OPERATORS, OperatorDesc, short_name


def operator_entry(op: type[OperatorDesc], features: frozenset[str] | None = None) -> dict[str, Any]:
    """One operator's entry; ``features``: the device features its kernels use (None before the device
    is known: every accepted type counts as served)."""
    served = op.served_types(features) if features is not None else {t: t.info.shader for t in op.accepted_types()}
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
        # every accepted type (DirectML's at the implemented level, and ONNX's beyond: 64-bit, BFLOAT16) this device runs
        "data_types_on_device": sorted(t.value for t, define in served.items() if define),
        # the accepted types with no kernel on this device, and the device feature that it lacks
        "data_types_without_kernel": [
            {"data_type": t.value, "missing_feature": t.info.feature, "reason": t.info.missing()}
            for t, define in sorted(served.items(), key=lambda kv: kv[0].value) if not define
        ],
    }


def catalog(features: frozenset[str] | None = None) -> dict[str, Any]:
    return {
        "feature_level": IMPLEMENTED_LEVEL.value,
        "operators": [operator_entry(op, features) for op in OPERATORS.values()],
    }
