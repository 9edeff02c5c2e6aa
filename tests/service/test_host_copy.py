"""service/host_copy.py: large copies split over the calling thread and a helper thread, byte-exact,
the helper started where the Copier is made (its CPUs and niceness), and an engine's large replay
copying through it."""
from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest

from service import host_copy
from service.host_copy import CHUNKS, SPLIT_BYTES, Copier
from tests.helpers import make_op


@pytest.fixture
def copier():
    c = Copier()
    yield c
    c.close()


@pytest.mark.parametrize("n", [0, 1, SPLIT_BYTES - 1, SPLIT_BYTES, SPLIT_BYTES + 7, 3 * SPLIT_BYTES + CHUNKS - 1])
def test_every_byte_lands_where_it_belongs(copier, n):
    rng = np.random.default_rng(n)
    for _ in range(3):  # the helper's state from one copy must not leak into the next
        src = rng.integers(0, 256, n, np.uint8)
        dst = np.full(n + 2, 0xAB, np.uint8)
        copier.copy(dst[1:-1], src)
        np.testing.assert_array_equal(dst[1:-1], src)
        assert dst[0] == dst[-1] == 0xAB  # nothing written outside the destination


def test_the_helper_copies_part_of_a_large_copy(copier, monkeypatch):
    """The caller's first chunk waits until the helper has copied one: the helper must take chunks of
    a copy of SPLIT_BYTES or more (without it, the caller would wait for nothing: the test fails)."""
    helped = threading.Event()
    caller = threading.get_ident()
    plain = np.copyto

    def copyto(dst, src):
        if threading.get_ident() == caller:
            assert helped.wait(30), "the helper never took a chunk"
        plain(dst, src)
        if threading.get_ident() != caller:
            helped.set()

    monkeypatch.setattr(host_copy.np, "copyto", copyto)
    src = np.arange(SPLIT_BYTES + 5, dtype=np.uint64).astype(np.uint8)
    dst = np.zeros_like(src)
    copier.copy(dst, src)
    np.testing.assert_array_equal(dst, src)
    assert copier.helper_chunks >= 1


def test_a_closed_copier_copies_on_the_caller_alone():
    c = Copier()
    c.close()
    src = np.arange(SPLIT_BYTES, dtype=np.uint32).view(np.uint8)[:SPLIT_BYTES]
    dst = np.zeros_like(src)
    c.copy(dst, src)
    np.testing.assert_array_equal(dst, src)
    assert c.helper_chunks == 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell the helper's from the caller's")
def test_the_helper_runs_on_the_cpus_of_the_thread_that_made_the_copier():
    """The device worker makes its engine (and so its Copier) in a thread on all of the service's CPUs,
    then pins its job thread to one: the helper must keep the maker's CPUs, not follow the job thread."""
    cpus = sorted(os.sched_getaffinity(0))
    made: list[Copier] = []

    def make() -> None:
        os.sched_setaffinity(0, {cpus[0]})  # this thread only (Linux)
        made.append(Copier())

    t = threading.Thread(target=make)
    t.start()
    t.join()
    try:
        assert os.sched_getaffinity(made[0]._thread.native_id) == {cpus[0]}
        assert os.sched_getaffinity(0) == set(cpus)  # the test's own thread untouched
    finally:
        made[0].close()


def test_an_engines_large_replay_copies_through_its_copier(monkeypatch):
    """A replayed job of SPLIT_BYTES or more copies its input in and its output out through the engine's
    Copier (the small path's memoryview copies stay on the job thread alone); the answer is right."""
    from service.config import Settings
    from service.engine import Engine

    engine = Engine(Settings(memory="host"))
    try:
        n = SPLIT_BYTES // 4
        op = make_op("SHRINK", np.float32, (n,), Bias=0.5, Threshold=0.5)
        key = pickle.dumps(op)
        source = np.zeros(op.inputs[0].total_bytes, np.uint8)
        out = np.zeros(op.output.total_bytes, np.uint8)
        engine.execute(op, [source], out=out, key=key)
        replay = engine.replayer(op, [source], out, key)
        copied: list[int] = []
        plain = engine._copier.copy
        monkeypatch.setattr(engine._copier, "copy", lambda dst, src: (copied.append(dst.nbytes), plain(dst, src)))
        x = np.random.default_rng(7).standard_normal(n).astype(np.float32)
        source[:] = x.view(np.uint8)
        assert replay() > 0
        np.testing.assert_array_equal(out.view(np.float32), op.reference(x).astype(np.float32))
        assert copied == [4 * n, 4 * n]  # in, then out
    finally:
        engine.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_place_moves_the_helper_alone(copier):
    """The device worker moves the helper off its pinned job thread's CPU (worker_process: place_copies)."""
    cpus = sorted(os.sched_getaffinity(0))
    assert copier.place(frozenset({cpus[-1]}))
    assert os.sched_getaffinity(copier._thread.native_id) == {cpus[-1]}
    assert os.sched_getaffinity(0) == set(cpus)
    assert not copier.place(frozenset({max(cpus) + 4096}))  # refused (no such CPU): stays where it was
    assert os.sched_getaffinity(copier._thread.native_id) == {cpus[-1]}
    src = np.arange(SPLIT_BYTES, dtype=np.uint16).view(np.uint8)
    dst = np.zeros_like(src)
    copier.copy(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_a_failed_chunk_fails_the_copy_and_the_copier_goes_on(copier, monkeypatch):
    """A chunk that fails, on either thread, fails the copy in the caller (never a copy half done in
    silence), nothing is written once it has raised, and the next copy works."""
    with pytest.raises(ValueError):
        copier.copy(np.zeros(SPLIT_BYTES, np.uint8), np.zeros(SPLIT_BYTES + 1, np.uint8))
    caller = threading.get_ident()
    plain = np.copyto
    failed = threading.Event()

    def copyto(dst, src):
        if threading.get_ident() != caller and not failed.is_set():
            failed.set()
            raise MemoryError("the helper's chunk")
        if threading.get_ident() == caller:
            assert failed.wait(30), "the helper never took a chunk"  # it takes (and fails) one first
        plain(dst, src)

    monkeypatch.setattr(host_copy.np, "copyto", copyto)
    dst = np.zeros(SPLIT_BYTES, np.uint8)
    with pytest.raises(MemoryError):
        copier.copy(dst, np.ones(SPLIT_BYTES, np.uint8))
    monkeypatch.setattr(host_copy.np, "copyto", plain)
    src = np.arange(SPLIT_BYTES, dtype=np.uint32).view(np.uint8)[:SPLIT_BYTES]
    dst = np.zeros_like(src)
    copier.copy(dst, src)
    np.testing.assert_array_equal(dst, src)
