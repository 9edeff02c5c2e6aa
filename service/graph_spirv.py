"""Generated graph shaders to SPIR-V: glslang at run time (the images carry it), into a
content-hashed cache that a read-only image still finds a place for."""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from .config import Settings
from .errors import ShaderCompileError


def generated_cache_dir(settings: Settings) -> Path:
    """Settings.generated_shader_cache, else generated/ under the SPIR-V cache, else (a read-only image)
    a directory under the system's temp dir."""
    for candidate in (settings.generated_shader_cache, settings.spirv_cache / "generated"):
        if candidate is None:
            continue
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    fallback = Path(tempfile.gettempdir()) / f"vkact-generated-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    return fallback


def generated_spirv(source: str, glsl_dir: Path, cache_dir: Path, glslang: str) -> tuple[bytes, int]:
    """(SPIR-V of a generated shader, 1 if glslang compiled it now or 0 if the cache had it). The key
    hashes the source and every include under glsl_dir/common."""
    h = hashlib.sha256(source.encode())
    for include in sorted((glsl_dir / "common").glob("*.glsl")):
        h.update(include.name.encode() + include.read_bytes())
    path = cache_dir / f"graph-{h.hexdigest()[:24]}.spv"
    if path.exists():
        return path.read_bytes(), 0
    fd, src = tempfile.mkstemp(dir=cache_dir, suffix=".comp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".spv.tmp")
    os.close(fd)
    try:
        cmd = [glslang, "-V", "--target-env", "vulkan1.1", f"-I{glsl_dir}", src, "-o", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except FileNotFoundError:
            raise ShaderCompileError(f"no {glslang} to compile a fused graph shader") from None
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and ln.strip() != src]
            raise ShaderCompileError("glslang refused the fused shader:\n" + "\n".join(lines[:20]))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        for leftover in (src, tmp):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path.read_bytes(), 1
