"""A load is all or nothing, whatever happens to its caller: a graph model's load cancelled while its
files are written (a gRPC client's reset or deadline cancels the call) or failing (a bad graph, a
device limit, the model limit, a full /dev/shm) leaves no attachment and no entry, and the model it
would have replaced serves on; a cancelled load never lands after a later one; loads of one name at
once through two processes end with one of them whole in both. An operator model's batching load and
a graph model's unload, cancelled, change nothing either.

No device worker: GraphModels and ModelBatching on a file of their own, two instances on one file
standing for two HTTP processes of one server (as test_graph_dataplane does)."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.dataplane import graphs
from service.dataplane.batching import Batching, ModelBatching
from service.dataplane.graph_models import GraphModels
from service.dataplane.metrics import Metrics
from service.dataplane.models import MODELS
from service.errors import DescriptorError, InvalidRequest, UnsupportedOnDevice
from service.shared_file import SharedFileWriteFailed
from tests.graph_helpers import activation, chain, linear_tanh_shrink_dict

# Driver-independent (test-portability.sh leaves them to make test): no device worker
pytestmark = pytest.mark.driver_independent

SETTINGS = Settings(pin_cpu="off", max_graph_models=2)


def _text(alpha: float, dtype: Any = np.float32) -> str:
    return json.dumps(linear_tanh_shrink_dict(dtype, alpha=alpha))


def _models(path: Path) -> GraphModels:
    return GraphModels(SETTINGS, Metrics().triton, str(path / "graphs.json"), lambda: None)


def _files(path: Path) -> set[str]:
    """What the server's graph model file has in the directory (document, lock, attachments)."""
    return {n for n in os.listdir(path) if n.startswith("graphs.json")}


def _serving(models: GraphModels, name: str) -> str:
    """The text model ``name`` was loaded with, as the file holds it (and the process's model agrees)."""
    serial = models.check(name)
    text = models._file.attached(serial)
    assert text is not None
    return text


@contextmanager
def _held(target: object, attribute: str, work: tuple[object, str]) -> Iterator[tuple[threading.Event, threading.Event, threading.Event]]:
    """The first call of ``target.attribute`` (in the change's thread) waits, once entered, until
    released; (entered, release, finished): finished when the first call of ``work`` (the thread's
    whole change: ``(owner, method)``) returned or raised."""
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    originals = {(target, attribute): getattr(target, attribute), work: getattr(*work)}
    first = [True, True]

    def held(*args: Any, **kwargs: Any) -> Any:
        if first[0]:
            first[0] = False
            entered.set()
            release.wait(30)
        return originals[(target, attribute)](*args, **kwargs)

    def worked(*args: Any, **kwargs: Any) -> Any:
        try:
            return originals[work](*args, **kwargs)
        finally:
            if first[1]:
                first[1] = False
                finished.set()

    setattr(target, attribute, held)
    setattr(*work, worked)
    try:
        yield entered, release, finished
    finally:
        release.set()
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


async def _cancelled_while_held(call: Callable[[], Any], held: tuple[threading.Event, threading.Event, threading.Event],
                                then: Callable[[], Any] | None = None) -> Any:
    """Start ``call``, cancel it once the held call is entered, start ``then``, then release the held
    call once ``then`` is done or has waited 3 s (it may rightly wait for ``call`` to be over); wait
    until the held change finished; ``then``'s result."""
    entered, release, finished = held
    task = asyncio.ensure_future(call())
    assert await asyncio.to_thread(entered.wait, 30)
    task.cancel()
    later = asyncio.ensure_future(then()) if then is not None else None
    await asyncio.wait([later] if later is not None else [asyncio.ensure_future(asyncio.sleep(0))], timeout=3)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await later if later is not None else None
    assert await asyncio.to_thread(finished.wait, 30)
    return result


@pytest.mark.parametrize("where", ["attach", "changing"])
def test_a_load_cancelled_before_its_write_leaves_nothing(tmp_path, where):
    """Cancelled while its config is written beside the file, or while it waits for the file's lock
    (another process holds it): no attachment, no entry, the model it would have replaced unchanged,
    in this process and the other."""
    async def scenario() -> None:
        models, other = _models(tmp_path), _models(tmp_path)
        await models.load("kept", _text(1.0), None)
        files = _files(tmp_path)
        for name in ("kept", "new"):   # a reload, a new model
            with _held(models._file, where, (models, "_store")) as held:
                await _cancelled_while_held(lambda: models.load(name, _text(0.5, np.float16), None), held)
            assert _files(tmp_path) == files
            for process in (models, other):
                assert process.names() == ["kept"] and _serving(process, "kept") == _text(1.0)
                assert (await process.find("kept")).graph == graphs.parse(json.loads(_text(1.0)), SETTINGS)
        assert models._triton.model("new") is None

    asyncio.run(scenario())


def test_a_cancelled_load_never_lands_after_a_later_one(tmp_path):
    """A reload cancelled while its config is written, then another reload of the name that completes:
    the complete one is what both processes serve, and its config is the only one left."""
    async def scenario() -> None:
        models, other = _models(tmp_path), _models(tmp_path)
        await models.load("m", _text(1.0), None)
        with _held(models._file, "attach", (models, "_store")) as held:
            await _cancelled_while_held(lambda: models.load("m", _text(0.5), None), held,
                                        then=lambda: models.load("m", _text(2.0), None))
        want = graphs.parse(json.loads(_text(2.0)), SETTINGS)
        for process in (models, other):
            assert _serving(process, "m") == _text(2.0) and (await process.find("m")).graph == want
        assert len(_files(tmp_path) - {"graphs.json", "graphs.json.lock"}) == 1   # one attachment: the winner's

    asyncio.run(scenario())


def test_a_failing_load_leaves_nothing(tmp_path, monkeypatch):
    """A bad graph (422), a tensor past the device's limit, a new name past VKACT_MAX_GRAPH_MODELS, a full
    /dev/shm (the config's attachment, or the document): each refused, the files as they were, the
    loaded models serving what they did."""
    async def scenario() -> None:
        models = _models(tmp_path)
        await models.load("a", _text(1.0), None)
        await models.load("b", _text(1.5), None)
        files = _files(tmp_path)
        bad = linear_tanh_shrink_dict(np.float32)
        bad["IntermediateEdges"][0]["ToNodeIndex"] = 7
        big = chain([activation("RELU", np.float32, (1 << 29,)), activation("SIGMOID", np.float32, (1 << 29,))])
        device = {"max_tensor_bytes": (1 << 31) - 16, "device": {"max_per_stage_storage_buffers": 16}}   # lavapipe's
        failing: list[tuple[str, str, dict | None, type[Exception]]] = [
            ("a", json.dumps(bad), None, DescriptorError),
            ("a", json.dumps(big), device, UnsupportedOnDevice),
            ("c", _text(3.0), None, InvalidRequest),   # a third model: over the limit
        ]
        for name, text, dev, error in failing:
            with pytest.raises(error):
                await models.load(name, text, dev)
        for stage in ("posix_fallocate", "rename"):   # the attachment's write, then the document's
            def no_room(*args: Any, **kwargs: Any) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            with monkeypatch.context() as m:
                m.setattr(os, stage, no_room)
                with pytest.raises(SharedFileWriteFailed):
                    await models.load("a", _text(0.25), None)
        assert _files(tmp_path) == files
        assert models.names() == ["a", "b"] and _serving(models, "a") == _text(1.0) and _serving(models, "b") == _text(1.5)
        assert models._triton.model("c") is None

    asyncio.run(scenario())


def test_loads_of_one_name_at_once_through_two_processes_end_whole(tmp_path):
    """Rounds of loads of one name at once through both processes: after each, both serve one of the
    configs loaded, the same one, whole (its graph, inputs and outputs), and one attachment is left."""
    async def scenario() -> None:
        models, other = _models(tmp_path), _models(tmp_path)
        for round in range(4):
            texts = [_text(1.0 + round + k / 8, np.float16 if k % 2 else np.float32) for k in range(4)]
            await asyncio.gather(*(process.load("m", text, None) for process, text in zip((models, other, models, other), texts)))
            served = _serving(models, "m")
            assert served in texts and _serving(other, "m") == served
            want = graphs.parse(json.loads(served), SETTINGS)
            for process in (models, other):
                model = await process.find("m")
                assert model.graph == want and [t.datatype for t in model.inputs] == ["FP16" if "FLOAT16" in served else "FP32"]
            assert len(_files(tmp_path) - {"graphs.json", "graphs.json.lock"}) == 1

    asyncio.run(scenario())


def test_a_cancelled_unload_and_batching_load_change_nothing(tmp_path):
    async def scenario() -> None:
        models = _models(tmp_path)
        await models.load("kept", _text(1.0), None)
        with _held(models._file, "changing", (models, "_remove")) as held:
            await _cancelled_while_held(lambda: models.unload("kept"), held)
        assert models.names() == ["kept"] and _serving(models, "kept") == _text(1.0)

        batching, other = ModelBatching(str(tmp_path / "batching.json")), ModelBatching(str(tmp_path / "batching.json"))
        op = MODELS["celu"]
        await batching.apply(op, Batching(2, True))
        for change in (Batching(4, True), None):
            with _held(batching._file, "changing", (batching, "_apply")) as held:
                await _cancelled_while_held(lambda: batching.apply(op, change), held)
            assert batching.get(op) == other.get(op) == Batching(2, True)
        await other.apply(op, None)
        assert batching.get(op) is None and batching.limit(op) is None

    asyncio.run(scenario())


def test_an_absent_document_costs_one_stat_and_appears_when_written(tmp_path, monkeypatch):
    """ModelBatching.limit runs per queued job: with no document (no load with a config, the usual
    case) it answers the service's limit from one stat per LIMIT_FRESH_S, never opening the file; a
    load through it is seen at once, and a document another process removed within LIMIT_FRESH_S."""
    import service.dataplane.batching as batching_module
    import service.shared_file as shared_file

    clock = [100.0]
    monkeypatch.setattr(batching_module.time, "monotonic", lambda: clock[0])
    batching = ModelBatching(str(tmp_path / "batching.json"))
    op = MODELS["shrink"]
    opened, stats = [], []
    real_open, real_stat = shared_file.os.open, shared_file.os.stat
    monkeypatch.setattr(shared_file.os, "open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    monkeypatch.setattr(shared_file.os, "stat", lambda *a, **k: stats.append(a[0]) or real_stat(*a, **k))
    assert [batching.limit(op) for _ in range(3)] == [None] * 3 and opened == [] and len(stats) == 1
    asyncio.run(batching.apply(op, Batching(4, True)))
    assert batching.limit(op) == 4  # its own load: at once
    os.unlink(batching.path)  # as another process's unload would
    assert batching.limit(op) == 4  # within LIMIT_FRESH_S: the view it took
    clock[0] += batching_module.LIMIT_FRESH_S
    assert batching.limit(op) is None
