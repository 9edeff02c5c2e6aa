"""IREE's modules compiled ahead of time, for a machine that has ``iree-base-runtime`` but not the
compiler (393 MB: too big to travel to the GPU machine).

``python -m bench.iree_aot DIR [--log2 24 ...] [--target ampere]`` compiles here every chain the
graphs bench gives IREE (bench/graphs.py's chains of 1, 2, 4 and 8 nodes, FLOAT32) at each size:
the modules have static shapes (``tensor<Nxf32>``), so each serves one size. DIR gets one ``.vmfb``
per module and ``manifest.json``: the compiler's version, its flags, and each module's file keyed by
the SHA-256 of its MLIR text, so a lookup finds exactly the program the compiler would have been
given (same formulas, scalars and size) or nothing.

There, ``VKACT_IREE_AOT=DIR`` makes bench/iree_peer.py load these modules when the compiler is absent.

The target: IREE 3.13's Vulkan targets stop at NVIDIA Ampere (``--iree-vulkan-target=ampere``, sm_80;
no Hopper entry), and Hopper (sm_90) has all of Ampere's features, so the default is ``ampere``: the
NVIDIA tuning IREE documents (workgroups for 32-wide subgroups) rather than its generic
``vp_android_baseline_2022``. Such a module asks for SPIR-V 1.6 and the Shader capability only, and
runs on lavapipe too (the dry run here)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

ENV = "VKACT_IREE_AOT"
MANIFEST = "manifest.json"
BACKEND = "vulkan-spirv"
DEFAULT_TARGET = "ampere"


def key(mlir_text: str) -> str:
    return hashlib.sha256(mlir_text.encode()).hexdigest()


def flags(target: str) -> list[str]:
    return ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={target}"]


def folder() -> Path | None:
    """The folder VKACT_IREE_AOT names, or None when unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def manifest(directory: Path) -> dict:
    """The folder's manifest; a clear error where it has none (VKACT_IREE_AOT names the wrong folder)."""
    path = directory / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{ENV}={directory}: no {MANIFEST} there (python -m bench.iree_aot {directory} writes it)")
    return json.loads(path.read_text())


def describe(directory: Path) -> str:
    """For the bench's header: what compiled these modules, with which flags, at which sizes."""
    m = manifest(directory)
    sizes = ", ".join(f"2^{s}" for s in m["log2_sizes"])
    return f"compiled ahead of time by {m['compiler']} for {m['backend']} ({' '.join(m['flags'])}) at {sizes} elements"


def load(directory: Path, mlir_text: str) -> bytes | None:
    """The module compiled ahead of time from ``mlir_text``, or None where the folder has none."""
    name = manifest(directory)["modules"].get(key(mlir_text))
    return None if name is None else (directory / name).read_bytes()


def programs(log2_sizes: list[int]) -> dict[str, str]:
    """File stem -> MLIR text: every chain bench/graphs.py gives IREE, at each size."""
    from . import graphs, iree_peer

    out = {}
    for log2 in log2_sizes:
        for family, kinds in graphs.CHAINS.items():
            for k in graphs.LENGTHS:
                stem = f"{'-'.join(kinds[:k]).lower()}.2e{log2}"
                out[stem] = iree_peer.mlir(kinds[:k], 1 << log2)
    return out


def compile_all(directory: Path, log2_sizes: list[int], target: str = DEFAULT_TARGET) -> dict:
    import iree.compiler as ic

    from importlib.metadata import version

    directory.mkdir(parents=True, exist_ok=True)
    modules = {}
    for stem, text in programs(log2_sizes).items():
        name = f"{stem}.vmfb"
        (directory / name).write_bytes(ic.compile_str(text, target_backends=[BACKEND], extra_args=flags(target)[1:]))
        modules[key(text)] = name
    m = {"compiler": f"iree-base-compiler {version('iree-base-compiler')}", "backend": BACKEND, "flags": flags(target),
         "log2_sizes": log2_sizes, "modules": modules}
    (directory / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")
    return m


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.iree_aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--log2", type=int, nargs="+", default=[24], help="sizes, as powers of two (default 24)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help=f"--iree-vulkan-target (default {DEFAULT_TARGET})")
    args = parser.parse_args(argv)
    m = compile_all(args.directory, args.log2, args.target)
    total = sum((args.directory / n).stat().st_size for n in m["modules"].values())
    print(f"{len(m['modules'])} modules, {total} bytes, in {args.directory} ({describe(args.directory)})")


if __name__ == "__main__":
    main()
