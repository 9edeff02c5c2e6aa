"""The service's files in /dev/shm (service/slots.py): tensor slots, shared-memory registries and graph models,
named by the process that made them and when it started, and removed when that process is gone, so a
killed server's files never pile up, collide, or hand a restarted server its predecessor's state."""
from __future__ import annotations

import os
import subprocess
import sys

from service.slots import SlotPool, process_start, sweep_stale_files


def _touch(directory, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_slots_of_gone_processes_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    me, started = os.getpid(), process_start(os.getpid())
    assert started is not None
    stale = [_touch(tmp_path, f"vkact-{dead_pid}-12345-0"),          # its process has exited
             _touch(tmp_path, f"vkact-{me}-{started + 1}-3"),         # this pid, another start: a previous container
             _touch(tmp_path, f"vkact-regions-{me}-{started + 1}.json"),  # that container's registrations
             _touch(tmp_path, f"vkact-graphs-{dead_pid}-12345.json.lock"),  # and a dead server's graph models
             _touch(tmp_path, f"vkact-graphs-{dead_pid}-12345.json.0123456789abcdef")]  # with a config
    kept = [_touch(tmp_path, f"vkact-{me}-{started}-0"),              # this very process's
            _touch(tmp_path, f"vkact-regions-{me}-{started}.json"),
            _touch(tmp_path, f"vkact-graphs-{me}-{started}.json"),
            _touch(tmp_path, f"vkact-graphs-{me}-{started}.json.0123456789abcdef"),
            _touch(tmp_path, "vkact-regions-7.json"),                 # not of the form: left alone
            _touch(tmp_path, "client-region")]                        # a client's shared memory
    assert sorted(sweep_stale_files(str(tmp_path))) == sorted(stale)
    assert all(os.path.exists(p) for p in kept) and not any(os.path.exists(p) for p in stale)


def test_a_pool_names_its_slots_by_process_and_start(monkeypatch, tmp_path):
    import service.slots as slots

    monkeypatch.setattr(slots, "SHM_DIR", str(tmp_path))
    leftover = _touch(tmp_path, f"vkact-{os.getpid()}-0")  # the old naming, as a killed server left it
    pool = SlotPool(2, lambda path: None)
    try:
        slot = pool.acquire(100)
        assert os.path.basename(slot.mapping.path) == f"vkact-{os.getpid()}-{process_start(os.getpid())}-0"
        assert os.path.exists(leftover)  # not a name of the new form: left alone, and no collision
    finally:
        pool.close()
    assert os.listdir(tmp_path) == [os.path.basename(leftover)]
