"""GLSL to SPIR-V: every kernel variant is compiled by glslang once, into a content-hashed cache.

A variant is (shader, data type, layout); its kind says which kernel contract it follows (elementwise
or reduction: how the engine dispatches it). The cache key covers the shader, every shared include,
the defines, so an edited shader is recompiled and an unchanged one never is (the compiler version is
left out: an image without glslang still finds the SPIR-V that its build stage compiled).
``python -m service.shaders`` compiles them all (the build step and the container image use it); a
shader that does not compile raises ShaderCompileError with glslang's message.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .config import Settings
from .errors import ShaderCompileError

LAYOUTS = ("PACKED", "STRIDED")
REDUCTION_UNROLLS = (1, 4)   # 4 where llvmpipe's loop limit needs it (Engine.reduction_unroll)


@dataclass(frozen=True)
class Variant:
    shader: str          # glsl/<shader>.comp
    dtype: str           # DataTypeInfo.shader, e.g. "F32"
    layout: str          # PACKED or STRIDED
    inputs: int = 1
    kind: str = "elementwise"   # OperatorDesc.kind: "elementwise" or "reduction" (the kernels' contract)
    unroll: int = 1      # reductions: element loop steps per iteration (4 on llvmpipe, see reduction.glsl)

    @property
    def defines(self) -> tuple[str, ...]:
        unroll = (f"UNROLL={self.unroll}",) if self.kind == "reduction" else ()
        return (f"DTYPE_{self.dtype}", f"LAYOUT_{self.layout}", f"INPUTS={self.inputs}", *unroll)

    def __str__(self) -> str:
        return f"{self.shader}[{self.dtype},{self.layout}]"


class ShaderCompiler:
    def __init__(self, settings: Settings) -> None:
        self.glsl_dir = settings.glsl_dir
        self.cache_dir = settings.spirv_cache
        self.glslang = settings.glslang

    def spirv(self, variant: Variant) -> bytes:
        """The SPIR-V of ``variant``, from the cache or compiled now."""
        path = self.cache_dir / f"{variant.shader}-{variant.dtype}-{variant.layout}-{self._key(variant)}.spv"
        if not path.exists():
            self._compile(variant, path)
        return path.read_bytes()

    def compile_all(self, variants: list[Variant]) -> dict[Variant, bytes]:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            return dict(zip(variants, pool.map(self.spirv, variants)))

    def _key(self, variant: Variant) -> str:
        h = hashlib.sha256()
        h.update((self.glsl_dir / f"{variant.shader}.comp").read_bytes())
        for include in sorted((self.glsl_dir / "common").glob("*.glsl")):
            h.update(include.name.encode() + include.read_bytes())
        h.update(" ".join(variant.defines).encode())
        return h.hexdigest()[:16]

    def _compile(self, variant: Variant, path: Path) -> None:
        source = self.glsl_dir / f"{variant.shader}.comp"
        if shutil.which(self.glslang) is None:
            raise ShaderCompileError(f"{variant}: no SPIR-V in {self.cache_dir} and no {self.glslang} to compile {source}")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write to a private temporary name and rename: concurrent compilers never see half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".spv.tmp")
        os.close(fd)
        cmd = [self.glslang, "-V", "--target-env", "vulkan1.1", *(f"-D{d}" for d in variant.defines), str(source), "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and ln.strip() != str(source)]
            raise ShaderCompileError(f"{variant} does not compile:\n" + "\n".join(lines))
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the service may run as another user (containers)
        os.replace(tmp, path)


def all_variants() -> list[Variant]:
    """Every kernel variant the registered operators need."""
    from .operators import OPERATORS  # local import: shaders.py must not depend on operator maths

    variants = []
    for op in OPERATORS.values():
        # every accepted type's native variant (BFLOAT16 and the 64-bit types included) and, where the
        # shader has it, its emulated one: the device picks among them (OperatorDesc.shader_dtype), and
        # glslang needs no device
        accepted = op.accepted_types()
        dtypes = sorted({t.info.shader for t in accepted} | {t.info.emulated for t in op.emulated_types & accepted if t.info.emulated})
        unrolls = REDUCTION_UNROLLS if op.kind == "reduction" else (1,)
        variants += [Variant(k, d, layout, len(op.input_fields), op.kind, u)
                     for k in op.all_kernels() for d in dtypes for layout in LAYOUTS for u in unrolls]
    return list(dict.fromkeys(variants))  # operators may share a shader (SOFTMAX and SOFTMAX1)


def main() -> None:
    settings = Settings()
    compiled = ShaderCompiler(settings).compile_all(all_variants())
    print(f"{len(compiled)} SPIR-V variants in {settings.spirv_cache}")


if __name__ == "__main__":
    main()
