"""Kernels run on a shared-memory slot's own pages (engine_direct): the device worker's large repeated jobs
on a CPU device. Each case sets up what the worker has (a slot mapping, a job's ranges in it, a first
execute on views of them), makes the direct replayer, and checks every replay against the numpy
reference, with new bytes written into the slot between replays as the HTTP side writes them."""
from __future__ import annotations

import mmap
import pickle
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from service.config import Settings
from service.engine import Engine
from service.operators import parse_operator
from tests.helpers import any_op, assert_matches, make_op, tensor

MIB = 1 << 20


@pytest.fixture(scope="module")
def direct():
    engine = Engine(Settings())
    if engine.slot_import_bytes is None:
        engine.close()
        pytest.skip("this device does not run jobs on imported host memory (slot_import_bytes None)")
    yield engine
    engine.close()


class Slot:
    """A shared mapping like a tensor slot's (service.slots.Mapping), with ranges laid out in it."""

    def __init__(self, size: int) -> None:
        self.mm = mmap.mmap(-1, size)
        self.array = np.frombuffer(self.mm, np.uint8)

    def close(self) -> None:
        del self.array
        self.mm.close()


@contextmanager
def mapped(engine: Engine, size: int) -> Iterator[Slot]:
    """A Slot, released by ``engine`` (as the worker's ``forget`` does) before it is unmapped."""
    slot = Slot(size)
    try:
        yield slot
    finally:
        engine.release_region(slot.array)
        slot.close()


def _binds_every_unit_offset(engine: Engine) -> bool:
    """Whether the device binds a buffer at a 16-byte offset into an imported mapping (NVIDIA's driver does;
    lavapipe wants 64 bytes, SwiftShader 256): where it does, no range a job can have is refused for its offset."""
    op = make_op("RELU", np.float32, (MIB // 4,))
    with mapped(engine, 4 * MIB) as slot:
        return engine.direct_replayer(op, slot.array, [(0, MIB)], (2 * MIB + 16, MIB), pickle.dumps(op)) is not None


def _first_run(engine: Engine, op, slot: Slot, inputs, output, key, in_place=False):
    ins = [slot.array[o : o + n] for o, n in inputs]
    engine.execute(op, ins, out=slot.array[output[0] : output[0] + output[1]], key=key, in_place=in_place)
    return engine.direct_replayer(op, slot.array, inputs, output, key)


@pytest.mark.parametrize("kind", ["SHRINK", "CELU", "RELU_GRAD"])
def test_a_direct_replay_computes_from_the_bytes_now_in_the_slot(direct, kind):
    n = 3 * MIB // 4  # 3 MiB of FLOAT32 per tensor
    nbytes = n * 4
    op = any_op(f"DML_OPERATOR_ACTIVATION_{kind}", np.float32, (n,)) if kind == "RELU_GRAD" else make_op(kind, np.float32, (n,))
    with mapped(direct, 12 * MIB + 4096) as slot:
        inputs = [(i * 4 * MIB, nbytes) for i in range(len(op.inputs))]
        output = (8 * MIB, nbytes)
        key = pickle.dumps(op)
        replay = _first_run(direct, op, slot, inputs, output, key)
        assert replay is not None
        before = direct.stats.direct_dispatches
        for seed in range(3):
            xs = [np.random.default_rng((seed, i)).standard_normal(n).astype(np.float32) for i in range(len(inputs))]
            for (offset, _), x in zip(inputs, xs):
                slot.array[offset : offset + nbytes] = x.view(np.uint8)
            slot.array[output[0] : output[0] + nbytes] = 0xAB  # what the last answer left
            assert replay() is not None
            got = slot.array[output[0] : output[0] + nbytes].view(np.float32).copy()
            assert_matches(got, op.reference(*xs), 4)
        assert direct.stats.direct_dispatches == before + 3


def test_an_in_place_job_writes_its_answer_over_its_input(direct):
    n = 2 * MIB // 4
    op = make_op("SOFTSIGN", np.float32, (n,))
    with mapped(direct, 2 * MIB + 4096) as slot:
        x = np.linspace(-8, 8, n, dtype=np.float32)
        slot.array[: 2 * MIB] = x.view(np.uint8)
        replay = _first_run(direct, op, slot, [(0, 2 * MIB)], (0, 2 * MIB), pickle.dumps(op), in_place=True)
        assert replay is not None
        y = np.linspace(-3, 5, n, dtype=np.float32)
        slot.array[: 2 * MIB] = y.view(np.uint8)
        assert replay() is not None
        assert_matches(slot.array[: 2 * MIB].view(np.float32), op.reference(y), 4)


@pytest.mark.parametrize("case", ["small", "partial unit", "strided", "padded", "overlap", "outside", "unbindable offset"])
def test_jobs_that_do_not_qualify_keep_the_copying_path(direct, case):
    """Each falls back to copies (None): too small to gain, a kernel's last unit reaching past its tensor, a
    layout table, bytes past the last element (on the slot they would keep an earlier request's bytes), ranges
    no HTTP side lays out, and a range the device cannot bind a buffer at (lavapipe: 64-byte offsets)."""
    if case == "unbindable offset" and _binds_every_unit_offset(direct):
        pytest.skip(f"{direct.device.name} binds a buffer at every 16-byte offset: no range is refused for its offset")
    n = 2 * MIB // 4
    with mapped(direct, 8 * MIB) as slot:
        if case == "small":
            n = 1024
        if case == "partial unit":
            n += 1
        if case == "strided":
            op = make_op("RELU", np.float32, (n,), out_strides=(2,))
        elif case == "padded":  # 4 elements in 4 MiB tensors: the answer's tail is not the kernel's to write
            op = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_RELU",
                                 "InputTensor": tensor(np.float32, (4,), TotalTensorSizeInBytes=2 * MIB),
                                 "OutputTensor": tensor(np.float32, (4,), TotalTensorSizeInBytes=2 * MIB)})
        else:
            op = make_op("RELU", np.float32, (n,))
        inputs = [(0, op.inputs[0].total_bytes)]
        output = {"overlap": (1024, op.output.total_bytes), "outside": (7 * MIB, op.output.total_bytes),
                  "unbindable offset": (4 * MIB + 16, op.output.total_bytes)}.get(case, (4 * MIB, op.output.total_bytes))
        if case in ("overlap", "outside", "unbindable offset"):  # as laid out by no HTTP side: the first run is skipped
            assert direct.direct_replayer(op, slot.array, inputs, output, pickle.dumps(op)) is None
        else:
            assert _first_run(direct, op, slot, inputs, output, pickle.dumps(op)) is None


def test_releasing_a_slot_makes_its_replayers_stale(direct):
    n = 2 * MIB // 4
    op = make_op("RELU", np.float32, (n,))
    with mapped(direct, 4 * MIB + 4096) as slot:
        replay = _first_run(direct, op, slot, [(0, 2 * MIB)], (2 * MIB, 2 * MIB), pickle.dumps(op))
        assert replay is not None and replay() is not None
        direct.release_region(slot.array)
        dispatches = direct.stats.dispatches
        assert replay() is None and direct.stats.dispatches == dispatches  # nothing ran on the released pages


def test_off_means_copies():
    engine = Engine(Settings(slot_import="off"))
    try:
        n = 2 * MIB // 4
        op = make_op("RELU", np.float32, (n,))
        slot = Slot(4 * MIB + 4096)
        try:
            assert engine.slot_import_bytes is None
            assert _first_run(engine, op, slot, [(0, 2 * MIB)], (2 * MIB, 2 * MIB), pickle.dumps(op)) is None
        finally:
            slot.close()
    finally:
        engine.close()


def test_a_refused_job_evicts_no_run_and_thrashing_jobs_copy_until_the_trim(direct):
    """The runs are capped (a quarter of max_pipelines: 2 here). A job the device will not bind (an offset
    lavapipe refuses) evicts nothing; once the cap's worth of runs has been evicted for new ones since the
    last trim, further new jobs copy (each would make a pipeline for the next to evict), until the trim. A
    device that binds every offset refuses no such job: there only the cap and the thrash are checked."""
    refuses_offsets = not _binds_every_unit_offset(direct)
    engine = Engine(Settings(max_pipelines=8))
    slots = [Slot(4 * MIB + 4096) for _ in range(5)]
    try:
        if engine.slot_import_bytes is None:
            pytest.skip("this device does not run jobs on imported host memory")
        op = make_op("RELU", np.float32, (MIB // 4,))
        key = pickle.dumps(op)
        made = [_first_run(engine, op, slot, [(0, MIB)], (2 * MIB, MIB), key) for slot in slots[:2]]
        assert all(r is not None for r in made)
        if refuses_offsets:
            assert engine.direct_replayer(op, slots[2].array, [(0, MIB)], (2 * MIB + 16, MIB), key) is None
            assert all(r() is not None for r in made)  # neither was evicted for the refused job
        third, fourth = (engine.direct_replayer(op, s.array, [(0, MIB)], (2 * MIB, MIB), key) for s in slots[2:4])
        assert third is not None and fourth is not None and all(r() is None for r in made)  # two evicted
        assert engine.direct_replayer(op, slots[4].array, [(0, MIB)], (2 * MIB, MIB), key) is None  # thrashing: copies
        engine.trim()
        assert engine.direct_replayer(op, slots[4].array, [(0, MIB)], (2 * MIB, MIB), key) is not None
    finally:
        for slot in slots:
            engine.release_region(slot.array)
            slot.close()
        engine.close()
