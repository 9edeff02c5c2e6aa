"""The small-request path on a CPU device: the pin_cpu setting (service/cpu_placement.py), the
worker's engine for one-workgroup dispatches (service/worker_process.py), and the running service's threads."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from service.config import Settings
import service.cpu_placement as placement
from service.cpu_placement import PROCESS_CPUS as CPUS
from service.cpu_placement import choose_cpu
from tests.helpers import make_op

several_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="pinning needs two CPUs or more")


def test_the_setting_is_auto_off_or_a_cpu_number():
    assert Settings().pin_cpu == "auto"
    for bad in ("on", "-1", "1.5", ""):
        with pytest.raises(ValidationError):
            Settings(pin_cpu=bad)
    with pytest.raises(ValidationError, match="would put all of them on one CPU"):
        Settings(pin_cpu="0", workers=2)
    assert Settings(pin_cpu="auto", workers=2).workers == 2


@several_cpus
def test_choose_cpu():
    assert choose_cpu("off", 1) is None
    assert choose_cpu("auto", 1) == max(CPUS)  # away from CPU 0 and its interrupts
    assert choose_cpu("auto", 2) is None        # several HTTP processes would crowd onto one CPU
    assert choose_cpu(str(min(CPUS)), 1) == min(CPUS)
    assert choose_cpu(str(max(CPUS) + 1000), 1) is None  # not ours: nothing pinned, with a warning


def test_one_cpu_pins_nothing(monkeypatch):
    monkeypatch.setattr(placement, "PROCESS_CPUS", frozenset({3}))
    assert choose_cpu("auto", 1) is None and choose_cpu("3", 1) is None


def test_dispatch_workgroups_is_what_prepare_makes(engine):
    """The worker routes by Engine.dispatch_workgroups, worked out without creating anything: it must
    agree with the dispatch that prepare() builds, packed, strided and reductions alike."""
    ops = [make_op("SHRINK", np.float32, (1, 1, 1, n)) for n in (1, 1024, 4095, 4096, 1 << 20)]
    ops += [make_op("CELU", np.float16, (2, 3, 64, 64)), make_op("SHRINK", np.float32, (4, 1024), strides=(2048, 2))]
    ops += [make_op("SOFTMAX", np.float32, (1, 1024)), make_op("SOFTMAX", np.float32, (4096, 1024)), make_op("HARDMAX", np.float32, (3, 50000))]
    counts = [engine.dispatch_workgroups(op) for op in ops]
    assert counts == [engine.prepare(op).workgroups for op in ops]
    assert counts[0] == 1 and counts[4] > 1 and counts[-2] > 1
    if engine.tuning.small_dispatch_engine:   # llvmpipe: 1,024 elements are one workgroup, the inline engine's
        assert counts[1] == 1


def test_small_dispatches_run_on_the_inline_engine(engine):
    """On lavapipe the worker makes a second engine without llvmpipe's compute pool for one-workgroup
    dispatches; its answers are those of numpy, and larger dispatches stay on the main engine."""
    from service.engine import Engine
    from service.jobs import descriptor_key as pickled
    from service.worker_engines import WorkerEngines
    from service.worker_process import _make_engine

    if engine.device.driver_name != "llvmpipe":
        pytest.skip("the inline engine is for llvmpipe")
    small = _make_engine(Engine, engine.settings, CPUS, engine.settings.worker_nice, inline=True)
    try:
        engines = WorkerEngines(engine, small)
        rng = np.random.default_rng(11)
        for n, expected in ((1024, small), (1 << 20, engine)):
            op = make_op("SHRINK", np.float32, (1, 1, 1, n), Bias=0.25, Threshold=0.75)
            key = pickled(op)
            routed_op, routed = engines.op(key)
            assert routed is expected and routed_op == op
            x = rng.standard_normal(n, dtype=np.float32)
            got = np.frombuffer(routed.execute(routed_op, [x.view(np.uint8)], key=key), np.float32)
            want = np.where(x < -0.75, x + 0.25, np.where(x > 0.75, x - 0.25, 0)).astype(np.float32)
            np.testing.assert_array_equal(got, want)
        assert small.stats.dispatches == 1 and "LP_NUM_THREADS" not in os.environ
    finally:
        small.close()


def _allowed(pid: int, tid: int) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


@several_cpus
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc")
def test_the_service_pins_its_event_loop_and_job_thread(server, http):
    """On lavapipe (a CPU device) with one HTTP process, 'auto' puts the event loop, the device
    worker's job thread and the small-dispatch engine's threads on the last CPU; the main engine's
    threads (its compute pool) keep every CPU, and the helper of the large copies (host_copy) runs on the
    CPUs other than the job thread's, at the job thread's niceness (the graph build thread, once a graph was
    built, runs there too, at the driver threads' niceness, with the driver threads it started)."""
    from bench.service import device_worker

    device = http.get("/v1/device").json()
    if device["driver"]["name"] != "llvmpipe":
        pytest.skip("the pinning and the small-dispatch engine measured on llvmpipe")
    cpu = device["pinned_cpu"]
    assert cpu == max(CPUS) and device["small_dispatch_engine"]
    x = np.arange(1024, dtype=np.float32)
    from client import Client
    with Client(server.url) as c:
        np.testing.assert_array_equal(c.shrink(x), np.where(np.abs(x) > 0.5, x, 0))
    pid = server.process.pid
    worker = device_worker(pid)
    assert worker is not None
    assert _allowed(pid, pid) == str(cpu)
    everything = f"{min(CPUS)}-{max(CPUS)}" if len(CPUS) == max(CPUS) - min(CPUS) + 1 else None
    threads = [_allowed(worker, int(t)) for t in os.listdir(f"/proc/{worker}/task")]
    assert _allowed(worker, worker) == str(cpu) and threads.count(str(cpu)) >= 2  # the job thread, the inline submit thread
    if everything is not None:
        assert threads.count(everything) >= 2  # the main engine's compute pool
    others = sorted(CPUS - {cpu})
    if others == list(range(others[0], others[-1] + 1)):  # the large copies' helper: beside the job thread, never on its CPU,
        beside = str(others[0]) if len(others) == 1 else f"{others[0]}-{others[-1]}"  # at its niceness, not the driver's
        there = [int(t) for t in os.listdir(f"/proc/{worker}/task") if _allowed(worker, int(t)) == beside]
        helpers = [t for t in there if os.getpriority(os.PRIO_PROCESS, t) == os.getpriority(os.PRIO_PROCESS, worker)]
        assert len(helpers) == 1  # the copy helper; besides it, only threads at the driver's niceness: the graph
        # build thread, once one started, and the driver threads it started (they inherit its CPUs and niceness)
        assert all(os.getpriority(os.PRIO_PROCESS, t) > os.getpriority(os.PRIO_PROCESS, worker) for t in there if t not in helpers)


def test_the_worker_takes_its_devices_paths(http):
    """The device worker's memory, workgroup size, small-dispatch engine and batch size are those
    device_tuning gives its device (any driver the run uses)."""
    from service.device_tuning import tuning_for
    from service.vulkan_probe import physical_devices

    device = http.get("/v1/device").json()
    probed = next(d for d in physical_devices() if d.name == device["name"])
    tuning = tuning_for(probed)
    asked = os.environ.get("VKACT_MEMORY", "auto")
    assert device["memory"] == (tuning.memory if asked == "auto" else asked)
    assert device["small_dispatch_engine"] == tuning.small_dispatch_engine
    assert device["max_batch"] == (int(os.environ.get("VKACT_MAX_BATCH", "0")) or tuning.max_batch)
    assert device["workgroup_size"] & (device["workgroup_size"] - 1) == 0


@several_cpus
def test_load_placement_moves_the_threads_away_under_a_queue_and_back_when_idle():
    """LoadPlacement (the device worker's job thread and small-dispatch engine threads): messages found
    waiting AWAY_AFTER times more than waited for move its threads off the event loop's CPU; a wait
    that blocks keeps them there; an idle pipe brings them back."""
    import threading

    from service.cpu_placement import AWAY_AFTER, LoadPlacement

    near, far = max(CPUS), frozenset(CPUS - {max(CPUS)})
    seen: list[frozenset[int]] = []

    def thread() -> None:  # a thread of our own, so the test's thread keeps its CPUs
        placement = LoadPlacement(near, far, frozenset({threading.get_native_id()}))
        os.sched_setaffinity(0, {near})
        for _ in range(AWAY_AFTER - 1):
            placement.waited(False)
        placement.waited(True)           # one wait blocked: not a queue yet
        placement.waited(False)
        seen.append(frozenset(os.sched_getaffinity(0)))
        assert not placement.away
        placement.waited(False)
        seen.append(frozenset(os.sched_getaffinity(0)))
        assert placement.away
        placement.waited(True)           # away, a wait alone does not bring it back: idle() does
        seen.append(frozenset(os.sched_getaffinity(0)))
        placement.idle()
        seen.append(frozenset(os.sched_getaffinity(0)))
        assert placement.moves == 2

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert seen == [frozenset({near}), far, far, frozenset({near})]


def test_a_batch_of_one_workgroup_jobs_runs_on_the_inline_engine(engine):
    """Jobs that each run on the small-dispatch engine alone run there as a batch too (one dispatch of
    a few workgroups on its submit thread), each answer numpy's; the main engine dispatches nothing."""
    import pickle
    import socket
    import tempfile

    from service import framing
    from service.engine import Engine
    from service.slots import Mapping
    from service.worker_engines import WorkerEngines
    from service.worker_process import _make_engine

    if engine.device.driver_name != "llvmpipe":
        pytest.skip("the inline engine is for llvmpipe")
    small = _make_engine(Engine, engine.settings, CPUS, engine.settings.worker_nice, inline=True)
    op = make_op("SHRINK", np.float32, (1, 1, 1, 1024), Bias=0.25, Threshold=0.75)
    key, step = pickle.dumps(op), 2 * op.output.total_bytes
    xs = [np.random.default_rng(i).standard_normal(1024, dtype=np.float32) for i in range(4)]
    path = os.path.join(tempfile.gettempdir(), f"vkact-test-batch-{os.getpid()}")
    mapping = Mapping(path, step * len(xs), True)
    try:
        for i, x in enumerate(xs):
            mapping.array[i * step : i * step + x.nbytes] = x.view(np.uint8)
        engines = WorkerEngines(engine, small)
        for i, x in enumerate(xs):
            engines.define(i, (key, path, step * len(xs), ((i * step, x.nbytes),), (i * step + x.nbytes, x.nbytes), False))
        main_before, small_before = engine.stats.dispatches, small.stats.dispatches
        a, b = socket.socketpair()
        with a, b:
            a.sendall(engines.batch({path: mapping}, tuple((10 + i, i) for i in range(len(xs)))))
            reply = framing.Reader(b.fileno()).next()
        assert reply[0] == "oks" and reply[2] == tuple(10 + i for i in range(len(xs)))  # all done, in one dispatch
        assert (engine.stats.dispatches - main_before, small.stats.dispatches - small_before) == (0, 1)
        for i, x in enumerate(xs):
            got = mapping.array[i * step + x.nbytes : (i + 1) * step].view(np.float32)
            np.testing.assert_array_equal(got, np.where(x < -0.75, x + 0.25, np.where(x > 0.75, x - 0.25, 0)).astype(np.float32))
    finally:
        os.unlink(path)
        mapping.close()
        small.close()


@several_cpus
def test_niced_driver_threads_go_away_at_niceness_zero_or_not_at_all():
    """The small-dispatch engine's threads run niced beside the event loop; away from it they would
    yield to any other process, so they move at niceness 0 and get their niceness back when they come
    back; a process that may not lower a niceness keeps everything near."""
    import threading

    from service.cpu_placement import AWAY_AFTER, LoadPlacement

    near, far = max(CPUS), frozenset(CPUS - {max(CPUS)})
    ready, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def driver() -> None:  # stands for a driver thread, niced as worker_process makes them
        os.sched_setaffinity(0, {near})
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        tids.append(threading.get_native_id())
        ready.set()
        done.wait(30)

    t = threading.Thread(target=driver)
    t.start()
    try:
        ready.wait(30)
        tid = tids[0]
        try:
            os.setpriority(os.PRIO_PROCESS, tid, 4)  # may this process lower a niceness?
            allowed = True
            os.setpriority(os.PRIO_PROCESS, tid, 5)
        except PermissionError:
            allowed = False
        placement = LoadPlacement(near, far, frozenset({tid}), frozenset({tid}), 5)
        for _ in range(AWAY_AFTER):
            placement.waited(False)
        if allowed:
            assert placement.away and os.getpriority(os.PRIO_PROCESS, tid) == 0 and os.sched_getaffinity(tid) == far
            placement.idle()
            assert os.getpriority(os.PRIO_PROCESS, tid) == 5 and os.sched_getaffinity(tid) == {near}
        else:
            assert placement.stays and not placement.away and os.sched_getaffinity(tid) == {near}
            assert os.getpriority(os.PRIO_PROCESS, tid) == 5
    finally:
        done.set()
        t.join()
