"""README's table of the operator/data-type pairs vkact serves, generated from the operator registry.

usage: python scripts/types_table.py [--readme README.md] [--device]
Writes the table between its two markers in the README (tests/service/test_readme.py checks that it is
current) and prints it. A 64-bit cell says what a device with the feature gets, then one without it:
"native / emulated" (both serve it), "native / 422 (shaderFloat64)" (refused, naming the feature).
--device: print instead what the Vulkan device at hand serves (its reported features, VKACT_DEVICE,
VKACT_NATIVE_64BIT), each pair served or refused with the missing feature; GET /v1/operators says the same.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.descriptors import DataType  # noqa: E402
from service.descriptors.datatypes import KERNEL_FEATURES  # noqa: E402
from service.operators import OPERATORS, short_name  # noqa: E402

BEGIN = "<!-- types-table: written by scripts/types_table.py from the operator registry; do not edit -->"
END = "<!-- types-table: end -->"
#: Every DataType (test_readme checks none is missing): the floats, BFLOAT16 (vkact's, not DirectML's) beside
#: FLOAT16, then the integers by width.
COLUMNS = [DataType.FLOAT32, DataType.FLOAT16, DataType.BFLOAT16, DataType.FLOAT64, DataType.INT8, DataType.INT16,
           DataType.INT32, DataType.INT64, DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64]


def cell(op, t: DataType, features: frozenset[str] | None) -> str:
    if t not in op.accepted_types():
        return ""
    if features is not None:   # one device
        served = op.served_types(features)[t]
        if served is None:
            return f"422 ({t.info.feature})"
        return "emulated" if served == t.info.emulated else "yes"
    if t.info.feature is None:
        return "yes"
    without = "emulated" if op.served_types(frozenset())[t] else f"422 ({t.info.feature})"
    return f"native / {without}"


def table(features: frozenset[str] | None = None) -> str:
    lines = ["| operator | " + " | ".join(t.name for t in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for op in OPERATORS.values():
        lines.append(f"| {short_name(op)} | " + " | ".join(cell(op, t, features) for t in COLUMNS) + " |")
    return "\n".join(lines)


def device_features() -> tuple[str, frozenset[str]]:
    from service.config import Settings
    from service.vulkan_probe import choose, physical_devices

    settings = Settings()
    device = choose(physical_devices(), settings.device)
    enabled = frozenset(f for f in KERNEL_FEATURES if f in device.features)
    return device.name, enabled if settings.native_64bit else frozenset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--device", action="store_true", help="print the table of the device at hand; write nothing")
    args = parser.parse_args()
    if args.device:
        name, features = device_features()
        print(f"{name}: kernels use {', '.join(sorted(features)) or 'no 64-bit feature'}\n{table(features)}")
        return
    text = args.readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")
    print(table())


if __name__ == "__main__":
    main()
