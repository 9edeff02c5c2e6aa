"""bench/iree_aot.py and bench/iree_peer.py without the compiler: the modules compiled ahead of time
cover every chain the graphs bench gives IREE, a lookup finds exactly the program the compiler would
have been given (formulas, scalars, size) or nothing, and the header says what compiled them. The
last test compiles and runs for real where the bench extra (IREE) is installed; CI has none."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bench import graphs, iree_aot, iree_peer


def _write_folder(tmp_path, programs: dict[str, bytes], log2_sizes=(24,)) -> None:
    modules = {}
    for i, (text, vmfb) in enumerate(programs.items()):
        (tmp_path / f"m{i}.vmfb").write_bytes(vmfb)
        modules[iree_aot.key(text)] = f"m{i}.vmfb"
    (tmp_path / iree_aot.MANIFEST).write_text(json.dumps({
        "compiler": "iree-base-compiler 3.13.0", "backend": "vulkan-spirv", "flags": iree_aot.flags("ampere"),
        "log2_sizes": list(log2_sizes), "modules": modules}))


def _no_compiler(monkeypatch, runtime: str | None = "3.13.0") -> None:
    monkeypatch.setattr(iree_peer, "_installed", lambda p: runtime if p == "iree-base-runtime" else None)


def test_programs_cover_every_chain_the_graphs_bench_gives_iree():
    log2 = 12
    given = set()
    for graph in graphs.graphs(log2).values():
        kinds = [op.type_name().removeprefix("DML_OPERATOR_ACTIVATION_") for op in graph.operators]
        if all(k in iree_peer.BODIES for k in kinds):
            given.add(iree_peer.mlir(kinds, 1 << log2))
    assert len(given) == 7   # 2 families x 4 lengths, the chains of 1 (LINEAR) being the same program
    assert given == set(iree_aot.programs([log2]).values())
    assert not given & set(iree_aot.programs([log2 + 1]).values())   # static shapes: one size each


def test_without_the_compiler_modules_come_from_the_folder_by_exact_program(tmp_path, monkeypatch):
    _no_compiler(monkeypatch)
    chain = ["LINEAR", "RELU"]
    _write_folder(tmp_path, {iree_peer.mlir(chain, 1 << 24): b"module-24"})
    monkeypatch.setenv(iree_aot.ENV, str(tmp_path))
    assert iree_peer.module(iree_peer.mlir(chain, 1 << 24)) == b"module-24"
    assert iree_peer.module(iree_peer.mlir(chain, 1 << 20)) is None          # another size
    assert iree_peer.module(iree_peer.mlir(["RELU", "LINEAR"], 1 << 24)) is None   # another chain
    other_scalars = {**iree_peer.BODIES, "LINEAR": [b.replace("0.5", "0.25") for b in iree_peer.BODIES["LINEAR"]]}
    assert iree_peer.module(iree_peer.mlir(chain, 1 << 24, other_scalars)) is None
    # a chain the folder lacks gives no IREE column for it (no error)
    assert iree_peer.chain(["LINEAR", "ELU"], np.zeros(1 << 10, np.float32), "any device") is None


def test_version_says_what_compiled_the_modules(tmp_path, monkeypatch):
    _no_compiler(monkeypatch)
    monkeypatch.delenv(iree_aot.ENV, raising=False)
    assert iree_peer.version() is None   # the runtime alone cannot compile: not usable
    _write_folder(tmp_path, {}, log2_sizes=(24, 16))
    monkeypatch.setenv(iree_aot.ENV, str(tmp_path))
    v = iree_peer.version()
    assert v.startswith("iree-base-runtime 3.13.0, modules compiled ahead of time by iree-base-compiler 3.13.0 for vulkan-spirv")
    assert "--iree-vulkan-target=ampere" in v and "2^24, 2^16 elements" in v
    _no_compiler(monkeypatch, runtime=None)
    assert iree_peer.version() is None


def test_a_folder_without_manifest_is_a_clear_error(tmp_path, monkeypatch):
    _no_compiler(monkeypatch)
    monkeypatch.setenv(iree_aot.ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=f"{iree_aot.ENV}=.*nowhere: no manifest.json there"):
        iree_peer.version()


def test_modules_compiled_ahead_of_time_run_as_the_compiled_ones(tmp_path, monkeypatch):
    pytest.importorskip("iree.compiler")
    pytest.importorskip("iree.runtime")
    log2 = 10
    manifest = iree_aot.compile_all(tmp_path, [log2])
    assert len(manifest["modules"]) == 7 and manifest["flags"] == iree_aot.flags("ampere")
    x = np.random.default_rng(0).standard_normal(1 << log2, dtype=np.float32) * 3
    kinds = graphs.CHAINS["exp/tanh"][:4]
    import iree.runtime as rt

    seen = rt.get_driver("vulkan").query_available_devices()
    if not seen:
        pytest.skip("IREE's Vulkan driver sees no device")
    name = seen[0]["name"]
    fresh = iree_peer.chain(kinds, x, name)
    fresh[0]()
    want = fresh[1]()
    _no_compiler(monkeypatch, runtime="3.13.0")
    monkeypatch.setenv(iree_aot.ENV, str(tmp_path))
    run, output = iree_peer.chain(kinds, x, name)
    assert iree_peer.chain(kinds, x, name + " (not this one)") is None
    run()
    np.testing.assert_allclose(output(), want, rtol=1e-6, atol=1e-7)
    # and both against float64 numpy: LINEAR 0.5/0.1, SCALED_TANH, SHRINK 0.5, SIGMOID
    y = np.tanh((0.5 * x.astype(np.float64) + 0.1) * 0.5)
    y = np.where(np.abs(y) > 0.5, y, 0.0)
    np.testing.assert_allclose(output(), 1 / (1 + np.exp(-y)), rtol=1e-5, atol=1e-6)
