"""README's "Tested on" table, written from the JSON reports of a portability run (tests/vulkan_validation.py
writes one per pytest run when VKACT_RUN_REPORT names it; scripts/test-portability.sh makes them).

usage: python scripts/tested_on.py REPORT.json... [--readme README.md]
Replaces what lies between the table's two markers in the README; prints the table.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

BEGIN = "<!-- tested-on: written by scripts/tested_on.py from `make test-portability`; do not edit -->"
END = "<!-- tested-on: end -->"


def row(report: dict) -> str:
    parts = (report["driver_info"], f"Vulkan {report['vulkan']}", f"(Debian {report['package']})" if report.get("package") else "")
    version = " ".join(x for x in parts if x.strip())
    counts = f"{report['passed']} passed, {report['failed']} failed, {report['skipped']} skipped"
    if report["error"]:
        counts += f", {report['error']} errors"
    result = ("pass" if report["exit_status"] == 0 else "**FAIL**") + f" ({counts})"
    validation = "off" if not report["validation"] else str(report["validation_errors"])
    return f"| {report['device']} | {version} | {report['memory']} | `{report['suite']}` | {result} | {validation} |"


def table(reports: list[dict]) -> str:
    lines = [
        "| Driver (device) | Version | Memory mode | Tests | Result | Validation errors |",
        "|---|---|---|---|---|---|",
        *(row(r) for r in reports),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path)
    parser.add_argument("--readme", type=Path, default=Path(__file__).resolve().parent.parent / "README.md")
    args = parser.parse_args()
    reports = [json.loads(p.read_text()) for p in args.reports if p.is_file()]
    text = table(reports)
    print(text)
    readme = args.readme.read_text()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"{args.readme}: no tested-on markers")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()
