"""The device worker process's side of a message: several jobs of one descriptor in one dispatch, and
each job answered on its own when that fails (run here in-process on the session's engine)."""
from __future__ import annotations

import os
import pickle
import tempfile

import numpy as np

from service.worker import _Engines, _Mapping
from tests.helpers import assert_matches, make_op


def _jobs(op, xs, path):
    key, step = pickle.dumps(op), 2 * op.output.total_bytes
    return [(i, key, path, step * len(xs), [(i * step, x.nbytes)], (i * step + x.nbytes, op.output.total_bytes), False) for i, x in enumerate(xs)]


def _scenario(engine, fail_batch: bool, monkeypatch):
    op = make_op("SHRINK", np.float32, (100,))
    xs = [np.random.default_rng(i).standard_normal(100).astype(np.float32) for i in range(4)]
    path = os.path.join(tempfile.gettempdir(), f"vkact-test-{os.getpid()}-{fail_batch}")
    step = 2 * op.output.total_bytes
    mapping = _Mapping(path, step * len(xs), True)
    try:
        for i, x in enumerate(xs):
            mapping.array[i * step : i * step + x.nbytes] = x.view(np.uint8)
        if fail_batch:
            def broken(*args, **kwargs):
                raise RuntimeError("a batch that fails")
            monkeypatch.setattr(engine, "execute_batch", broken)
        dispatches = engine.stats.dispatches
        replies = _Engines(engine).run_jobs({path: mapping}, _jobs(op, xs, path))
        assert [r[:2] for r in replies] == [(i, "done") for i in range(len(xs))]
        for i, x in enumerate(xs):
            y = mapping.array[i * step + x.nbytes : (i + 1) * step].view(np.float32).copy()
            assert_matches(y, op.reference(x), 0)
        return engine.stats.dispatches - dispatches
    finally:
        os.unlink(path)
        mapping.close()


def test_jobs_of_one_message_run_in_one_dispatch(engine, monkeypatch):
    assert _scenario(engine, False, monkeypatch) == 1


def test_a_failed_batch_answers_each_job_alone(engine, monkeypatch):
    assert _scenario(engine, True, monkeypatch) == 4
