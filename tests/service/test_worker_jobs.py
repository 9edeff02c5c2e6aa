"""The device worker process's side of a message (run here in-process on the session's engine):
several jobs of one descriptor in one dispatch, each job answered on its own when that fails, and
a repeated job replayed from its template."""
from __future__ import annotations

import os
import pickle
import socket
import tempfile

import numpy as np

from service import framing
from service.slots import Mapping
from service.jobs import TemplateIds
from service.worker_engines import WorkerEngines
from tests.helpers import assert_matches, make_op


def _jobs(op, xs, path):
    key, step = pickle.dumps(op), 2 * op.output.total_bytes
    return [(i, key, path, step * len(xs), [(i * step, x.nbytes)], (i * step + x.nbytes, op.output.total_bytes), False) for i, x in enumerate(xs)]


def _scenario(engine, fail_batch: bool, monkeypatch):
    op = make_op("SHRINK", np.float32, (100,))
    xs = [np.random.default_rng(i).standard_normal(100).astype(np.float32) for i in range(4)]
    path = os.path.join(tempfile.gettempdir(), f"vkact-test-{os.getpid()}-{fail_batch}")
    step = 2 * op.output.total_bytes
    mapping = Mapping(path, step * len(xs), True)
    engines = WorkerEngines(engine)
    try:
        for i, x in enumerate(xs):
            mapping.array[i * step : i * step + x.nbytes] = x.view(np.uint8)
        if fail_batch:
            def broken(*args, **kwargs):
                raise RuntimeError("a batch that fails")
            monkeypatch.setattr(engine, "execute_batch", broken)
        dispatches = engine.stats.dispatches
        for job_id, *template in _jobs(op, xs, path):
            engines.define(job_id, tuple(template))
        reply = _reply(engines.batch({path: mapping}, tuple((i, i) for i in range(len(xs)))))
        if fail_batch:
            assert reply[0] == "done" and [r[:2] for r in reply[1]] == [(i, "done") for i in range(len(xs))]
        else:
            assert reply[0] == "oks" and reply[2] == tuple(range(len(xs)))
        for i, x in enumerate(xs):
            y = mapping.array[i * step + x.nbytes : (i + 1) * step].view(np.float32).copy()
            assert_matches(y, op.reference(x), 0)
        return engine.stats.dispatches - dispatches
    finally:
        engines.forget({path: mapping}, path)  # unmaps it, with the views the batch kept
        os.unlink(path)


def test_jobs_of_one_message_run_in_one_dispatch(engine, monkeypatch):
    assert _scenario(engine, False, monkeypatch) == 1


def test_a_failed_batch_answers_each_job_alone(engine, monkeypatch):
    assert _scenario(engine, True, monkeypatch) == 4


def test_template_numbers_are_reused_within_their_limit():
    ids = TemplateIds(limit=2)
    a, b, c = (("k", f"/dev/shm/{n}", 64, ((0, 16),), (16, 16), False) for n in "abc")
    assert ids.number(a) == (0, True) and ids.number(a) == (0, False)
    assert ids.number(b) == (1, True)
    ids.number(a)                         # b is now the least recently used
    assert ids.number(c) == (1, True)     # and gives c its number
    assert ids.number(b) == (0, True)     # a was least recently used by then
    ids.drop_slot("/dev/shm/c")           # c's slot was replaced: its number is free again
    assert ids.number(a) == (1, True)


def _reply(data: bytes) -> tuple:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        return framing.Reader(b.fileno()).next()


def test_a_template_runs_whole_once_then_replays_on_new_bytes(engine):
    """What the worker does with "template" and "go" messages: the first job runs as any job and
    answers "done"; later ones replay it and answer "ok", each computing from the bytes now in the
    slot; a replay that fails or went stale runs whole again; a forgotten slot takes its templates."""
    op = make_op("SHRINK", np.float32, (1000,))
    n = op.output.total_bytes
    path = os.path.join(tempfile.gettempdir(), f"vkact-test-{os.getpid()}-template")
    mapping = Mapping(path, 2 * n, True)
    mappings = {path: mapping}
    engines = WorkerEngines(engine)
    engines.define(5, (pickle.dumps(op), path, 2 * n, ((0, n),), (n, n), False))
    try:
        kinds = []
        for job in range(4):
            x = np.random.default_rng(job).standard_normal(1000).astype(np.float32)
            mapping.array[:n] = x.view(np.uint8)
            mapping.array[n:] = 0xAB
            if job == 2:  # a replay that raises: the job runs whole, a new replayer follows
                engines._replays[5] = lambda: 1 / 0
            reply = _reply(engines.go(mappings, job, 5))
            kinds.append(reply[0])
            assert reply[:2] == ("ok", job) if reply[0] == "ok" else reply == ("done", [(job, "done", reply[1][0][2], 1)])
            assert_matches(mapping.array[n:].view(np.float32).copy(), op.reference(x), 0)
        assert kinds == ["done", "ok", "done", "ok"]
        engines.forget(mappings, path)
        assert path not in mappings
        reply = _reply(engines.go(mappings, 4, 5))
        assert reply[1][0][:3] == (4, "error", "DeviceFailure")
    finally:
        os.unlink(path)
        if path in mappings:  # else forget() closed it
            mapping.close()


def test_a_batch_message_names_its_jobs_templates(engine):
    """A "batch" message carries (job id, template id) pairs: the jobs run as one dispatch and are
    answered by one "oks" (kernel seconds, ids); a job naming a template the worker never got is
    answered with an error, the others still run (a batch that fails: _scenario above); the views a
    batch keeps of a slot go with it."""
    op = make_op("SHRINK", np.float32, (100,))
    xs = [np.random.default_rng(10 + i).standard_normal(100).astype(np.float32) for i in range(3)]
    path = os.path.join(tempfile.gettempdir(), f"vkact-test-{os.getpid()}-batch")
    step = 2 * op.output.total_bytes
    mapping = Mapping(path, step * len(xs), True)
    engines = WorkerEngines(engine)
    mappings = {path: mapping}
    for tid, (job_id, *template) in enumerate(_jobs(op, xs, path)):
        engines.define(tid, (template[0], template[1], template[2], tuple(template[3]), template[4], template[5]))

    def overwrite_outputs() -> None:  # each must be computed again
        for i, x in enumerate(xs):
            mapping.array[i * step + x.nbytes : (i + 1) * step] = 0xAB

    def outputs_right(which=range(len(xs))) -> None:
        for i in which:
            x = xs[i]
            y = mapping.array[i * step + x.nbytes : (i + 1) * step].view(np.float32).copy()
            assert_matches(y, op.reference(x), 0)

    try:
        for i, x in enumerate(xs):
            mapping.array[i * step : i * step + x.nbytes] = x.view(np.uint8)
        dispatches = engine.stats.dispatches
        reply = _reply(engines.batch(mappings, ((7, 0), (8, 1), (9, 2))))
        assert reply[0] == "oks" and reply[2] == (7, 8, 9) and reply[1] >= 0
        assert engine.stats.dispatches - dispatches == 1
        outputs_right()

        overwrite_outputs()
        reply = _reply(engines.batch(mappings, ((10, 0), (11, 99), (12, 1))))
        assert reply[0] == "done"
        answers = {r[0]: r[1:3] for r in reply[1]}
        assert answers[10][0] == answers[12][0] == "done"
        assert answers[11] == ("error", "DeviceFailure")
        outputs_right([0, 1])  # templates 0 and 1 ran (jobs 10 and 12)
        engines.forget(mappings, path)
        assert mapping.mm.closed  # no view that the batches kept outlives the slot
    finally:
        engines.forget(mappings, path)
        os.unlink(path)
