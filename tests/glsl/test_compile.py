"""Every kernel variant compiles; a broken shader fails with glslang's own message."""
from __future__ import annotations

import shutil

import pytest

from service.config import Settings
from service.errors import ShaderCompileError
from service.shaders import ShaderCompiler, Variant, all_variants


def test_every_registered_variant_compiles():
    compiled = ShaderCompiler(Settings()).compile_all(all_variants())
    assert len(compiled) == len(all_variants()) >= 16
    assert all(spv[:4] == b"\x03\x02\x23\x07" for spv in compiled.values())  # SPIR-V magic


def test_broken_shader_reports_the_compiler_message(tmp_path):
    glsl = tmp_path / "glsl"
    shutil.copytree(Settings().glsl_dir, glsl)
    (glsl / "broken.comp").write_text(
        '#version 450\n#extension GL_GOOGLE_include_directive : require\n#include "common/elementwise.glsl"\n'
        "float activate(float x) { return x * undefined_name; }\n"
    )
    compiler = ShaderCompiler(Settings(glsl_dir=glsl, spirv_cache=tmp_path / "cache"))
    with pytest.raises(ShaderCompileError) as info:
        compiler.spirv(Variant("broken", "F32", "PACKED"))
    assert "undefined_name" in str(info.value) and "ERROR" in str(info.value)
    assert not list((tmp_path / "cache").glob("*.spv"))  # nothing half-written is cached


def test_cache_key_follows_the_sources(tmp_path):
    glsl = tmp_path / "glsl"
    shutil.copytree(Settings().glsl_dir, glsl)
    compiler = ShaderCompiler(Settings(glsl_dir=glsl, spirv_cache=tmp_path / "cache"))
    variant = Variant("softsign", "F32", "PACKED")
    compiler.spirv(variant)
    (glsl / "common" / "numerics.glsl").write_text((glsl / "common" / "numerics.glsl").read_text() + "\n// edit\n")
    compiler.spirv(variant)
    assert len(list((tmp_path / "cache").glob("softsign-F32-PACKED-*.spv"))) == 2
