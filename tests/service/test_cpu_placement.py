"""CPU placement of the small-request path (service/cpu_placement.py): the setting, the driver
threads' narrowing and spreading, the engine's hook, and the running service's threads."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from service.config import Settings
from service.cpu_placement import allowed_cpus, choose_cpu
from tests.helpers import make_op

CPUS = allowed_cpus()
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
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert choose_cpu("auto", 1) is None and choose_cpu("3", 1) is None


@several_cpus
def test_driver_threads_follow_the_dispatch_size():
    """In a child process (affinity is per thread, and the test runner's threads must stay free): the
    other threads go onto the job thread's CPU for one workgroup and back onto every CPU for more;
    a thread started later is placed at the next change; the job thread itself is never moved."""
    script = textwrap.dedent("""
        import os, threading, json
        from service.cpu_placement import DriverThreads
        stop = threading.Event()
        def affinity(tid): return sorted(os.sched_getaffinity(tid))
        def others(): return [int(t) for t in os.listdir("/proc/self/task") if int(t) != threading.get_native_id()]
        workers = [threading.Thread(target=stop.wait) for _ in range(2)]
        for w in workers: w.start()
        everything = sorted(os.sched_getaffinity(0))
        cpu = everything[-1]
        placement = DriverThreads(cpu)
        seen = {}
        placement.fit(1); seen["one"] = [affinity(t) for t in others()]
        placement.fit(1); seen["changes_after_repeat"] = placement.changes
        late = threading.Thread(target=stop.wait); late.start()
        placement.fit(64); seen["many"] = [affinity(t) for t in others()]
        placement.fit(1); seen["one_again"] = [affinity(t) for t in others()]
        seen["job"] = affinity(0)
        stop.set()
        print(json.dumps({"cpu": cpu, "all": everything, "seen": seen, "changes": placement.changes}))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json
    got = json.loads(out.stdout)
    cpu, everything, seen = got["cpu"], got["all"], got["seen"]
    assert len(seen["one"]) == 2 and seen["one"] == [[cpu]] * 2
    assert seen["changes_after_repeat"] == 1  # no system calls while the size class stays
    assert seen["many"] == [everything] * 3
    assert seen["one_again"] == [[cpu]] * 3   # the late thread too
    assert seen["job"] == everything and got["changes"] == 3


def test_the_engine_reports_each_dispatch_size(engine):
    seen: list[int] = []
    engine.on_dispatch = seen.append
    try:
        rng = np.random.default_rng(5)
        for n in (1024, 1 << 20):
            op = make_op("SHRINK", np.float32, (1, 1, 1, n))
            x = rng.standard_normal(n, dtype=np.float32)
            out = np.frombuffer(engine.execute(op, [x.view(np.uint8)], key=("placement", n)), np.float32)
            np.testing.assert_array_equal(out, np.where(np.abs(x) > np.float32(0.5), x, np.float32(0)))
    finally:
        engine.on_dispatch = None
    # 1,024 floats are 256 16-byte units: one workgroup of 256 invocations at 4 units each on a CPU.
    # An elementwise dispatch covers its buffer slot (a size bucket), not just the tensor.
    units_per_group = engine.settings.local_size * engine.units_per_invocation
    capacity = engine.prepare(make_op("SHRINK", np.float32, (1, 1, 1, 1 << 20))).slot.capacity
    assert capacity >= (1 << 22)
    assert seen == [1, min(-(-(capacity // 16) // units_per_group), engine.max_workgroups)] and seen[1] > 1


def _allowed(pid: int, tid: int) -> str:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return next(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list"))


@several_cpus
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc")
def test_the_service_pins_its_event_loop_and_job_thread(server, http):
    """On lavapipe (a CPU device) with one HTTP process, 'auto' puts the event loop and the device
    worker's job thread on the last CPU, and a small request leaves the driver's threads there."""
    from bench.service import device_worker

    cpu = http.get("/v1/device").json()["pinned_cpu"]
    assert cpu == max(CPUS)
    x = np.arange(1024, dtype=np.float32)
    from client import Client
    with Client(server.url) as c:
        np.testing.assert_array_equal(c.shrink(x), np.where(np.abs(x) > 0.5, x, 0))
    pid = server.process.pid
    worker = device_worker(pid)
    assert worker is not None
    assert _allowed(pid, pid) == str(cpu)
    assert {_allowed(worker, int(t)) for t in os.listdir(f"/proc/{worker}/task")} == {str(cpu)}
