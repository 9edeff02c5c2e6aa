"""The device worker's side of a large repeated job on a CPU device (service/worker_process.py with
service/engine_direct.py): the first job of a template runs on copies and leaves a replayer that runs on the
slot's own pages; every replay answers from the bytes now in the slot; a slot the HTTP side replaces is
released by the engine before the worker unmaps it. In this process, on the engine the worker would make."""
from __future__ import annotations

import os
import pickle
import uuid

import numpy as np
import pytest

from service.config import Settings
from service.engine import Engine
from service.slots import SHM_DIR, Mapping
from service.worker_engines import WorkerEngines
from tests.helpers import assert_matches, make_op

N = 1 << 20  # 4 MiB of FLOAT32 each way


@pytest.fixture
def engines():
    engine = Engine(Settings())
    if engine.slot_import_bytes is None:
        engine.close()
        pytest.skip("this device does not run jobs on imported host memory")
    yield WorkerEngines(engine)
    engine.close()


def test_a_repeated_job_replays_on_its_slot_and_its_slot_is_released_before_unmapping(engines):
    op = make_op("SHRINK", np.float32, (N,), Bias=0.25, Threshold=0.5)
    nbytes = 4 * N
    path = os.path.join(SHM_DIR, f"vkact-test-direct-{uuid.uuid4().hex}")
    size = 2 * nbytes + 4096
    Mapping(path, size, True).close()  # made by "the HTTP side"
    mappings: dict[str, Mapping] = {}
    ours = Mapping(path, size, False)  # the HTTP side's own mapping, which writes the requests
    try:
        engines.define(7, (pickle.dumps(op), path, size, ((0, nbytes),), (nbytes, nbytes), False))
        engine = engines.main
        rng = np.random.default_rng(3)
        for job_id in range(4):  # the first runs whole (copies), the rest replay on the slot
            x = rng.standard_normal(N).astype(np.float32)
            ours.array[:nbytes] = x.view(np.uint8)
            ours.array[nbytes : 2 * nbytes] = 0xAB
            engines.go(mappings, job_id, 7)
            assert_matches(ours.array[nbytes : 2 * nbytes].view(np.float32).copy(), op.reference(x), 0)
        assert engine.stats.direct_dispatches == 3
        assert engine._direct._regions  # the slot is imported
        engines.forget(mappings, path)
        assert not engine._direct._regions and not engine._direct._runs and path not in mappings
    finally:
        ours.close()
        os.unlink(path)
