"""The supervisor of ``python -m service``: it runs the HTTP server (uvicorn, with its device workers)
as a child process and starts it again when it dies abnormally (a signal, a crash, the OOM killer),
with a growing back-off, after removing what the dead process left in /dev/shm. A clean exit, or a
SIGTERM/SIGINT to the supervisor (passed on to the child), ends both; so does a server that cannot
start (uvicorn's startup failure, or five quick exits in a row): a restart would only repeat it.

The shared-memory registry is named after the supervisor (SUPERVISOR_ENV), not the HTTP process, so
the regions that clients registered survive a restart of the HTTP process.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from .restart_backoff import STABLE_S, RestartBackoff
from .slots import SERVER_FILES, SHM_DIR, owner_tag, sweep_stale_files

log = logging.getLogger("vkact.supervisor")
SUPERVISOR_ENV = "VKACT_SUPERVISOR_PID"  # tells the HTTP processes whose registry they share
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.5, 30.0  # the restart delay (restart_backoff); QUICK_EXITS stops it at 8 s
# uvicorn's exit status when the app could not start (a port taken, a setting the lifespan refuses):
# a fault that a restart cannot mend, so the supervisor stops with it instead of retrying for ever.
STARTUP_FAILURE = 3
QUICK_EXITS = 5  # exits in a row, each before STABLE_S, after which it stops too (the container's policy takes over)


def registry_owner(workers: int) -> int:
    """The process the shared-memory registry is named after: the supervisor when there is one, else
    the server's own process (uvicorn's parent with --workers > 1)."""
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    if supervisor.isdigit():
        return int(supervisor)
    return os.getppid() if workers > 1 else os.getpid()


def _remove_registry(tag: str) -> None:
    """Remove the server's shared documents (slots.SERVER_FILES)."""
    prefixes = tuple(f"vkact-{kind}-{tag}.json" for kind in SERVER_FILES)
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefixes):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass


def _reap() -> None:
    """Collect exited children other than the server (none runs now): as a container's PID 1 this
    process inherits the dead server's device worker, which exits when it sees its pipe close."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def supervise(argv: list[str]) -> int:
    """Run ``python -m service --no-supervise ARGV`` until it exits cleanly or we are told to stop;
    returns its last exit status."""
    stop = threading.Event()
    child: subprocess.Popen | None = None
    stopped_by: list[int] = []  # the signal that told us to stop

    def forward(signum: int, _frame: object) -> None:
        stopped_by.append(signum)
        stop.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    backoff = RestartBackoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
    code = 0
    try:
        while not stop.is_set():
            started = time.monotonic()
            child = subprocess.Popen([sys.executable, "-m", "service", "--no-supervise", *argv], env=env)
            if stop.is_set():  # told to stop while Popen ran: forward() saw the previous, dead child
                child.send_signal(stopped_by[-1])
            code = child.wait()
            if stop.is_set() or code == 0:
                break
            for path in sweep_stale_files():
                log.warning("removed %s, left by the HTTP process that died", path)
            delay = backoff.after_death(time.monotonic() - started, STABLE_S)
            if code == STARTUP_FAILURE or backoff.quick_exits >= QUICK_EXITS:
                log.error("the HTTP server exited with status %s %s; not restarting it", code,
                          "as it could not start" if code == STARTUP_FAILURE else f"{backoff.quick_exits} times in a row within {STABLE_S:.0f} s")
                break
            log.error("the HTTP server exited with status %s; restarting in %.1f s", code, delay)
            stop.wait(delay)
            _reap()
    finally:
        _remove_registry(owner_tag(os.getpid()))
    if stop.is_set() and code in (-signal.SIGTERM, -signal.SIGINT):
        return 0  # uvicorn shuts down gracefully, then re-raises the signal it was stopped by
    return code if code >= 0 else 128 - code  # as a shell reports a child killed by a signal
