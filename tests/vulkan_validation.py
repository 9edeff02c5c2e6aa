"""The Khronos validation layer as a test oracle: with VKACT_VALIDATION=1 every Vulkan instance of the
run (this process's and every subprocess's: the service's device workers) loads VK_LAYER_KHRONOS_validation
with synchronization validation on, and a test during which the layer reports an error fails.

How the messages come back: the layer writes its log to one file (``khronos_validation.log_filename``,
opened by every process that creates an instance), here a FIFO. A ``cat`` process, not a thread of this
one (kp holds the GIL through a whole submission, and a layer message written then must not wait for
Python), drains the FIFO into a regular file. After each test a marker line goes into the FIFO; once it
reaches the file, everything before it was written before the test ended, and the lines since the
previous marker are the test's messages.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ENABLED = os.environ.get("VKACT_VALIDATION") == "1"
LAYER = "VK_LAYER_KHRONOS_validation"
MARK = "vkact-validation-mark"
LAYER_DIRS = ("/usr/share/vulkan/explicit_layer.d", "/etc/vulkan/explicit_layer.d", "/usr/local/share/vulkan/explicit_layer.d")
MARK_WAIT_S = 30.0      # how long a marker may take through the FIFO (subprocess messages before it)


def _die_with_parent() -> None:
    """In the drain's process before exec: Linux ends it when pytest ends, however pytest ends; an interrupt
    (Ctrl-C, `timeout -s INT`: sent to the whole process group) is left to pytest, which still reads the log
    when it stops (an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ValidationLog:
    """The layer's settings, its FIFO, the drained log, and how far the tests have read it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vkact-validation-"))
        self.fifo = self.dir / "layer.fifo"
        self.log = self.dir / "layer.log"
        os.mkfifo(self.fifo)
        self.log.touch()
        (self.dir / "vk_layer_settings.txt").write_text(
            "khronos_validation.report_flags = error\n"
            "khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG\n"
            f"khronos_validation.log_filename = {self.fifo}\n"
            "khronos_validation.enables = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT\n"
            "khronos_validation.duplicate_message_limit = 20\n"
        )
        # `0<>` opens the FIFO read-write: cat never sees end-of-file between writers.
        self.drain = subprocess.Popen(["sh", "-c", 'exec cat 0<>"$0" >>"$1"', str(self.fifo), str(self.log)],
                                      preexec_fn=_die_with_parent)
        self._offset = 0
        self._marks = 0
        self.errors_total = 0
        os.environ["VK_LAYER_SETTINGS_PATH"] = str(self.dir)
        layers = [x for x in os.environ.get("VK_INSTANCE_LAYERS", "").split(":") if x]
        os.environ["VK_INSTANCE_LAYERS"] = ":".join([*layers, LAYER] if LAYER not in layers else layers)

    def messages_since_last_read(self) -> list[str]:
        """The layer's error messages written since the previous call (bounded wait for the marker)."""
        self._marks += 1
        mark = f"{MARK} {self._marks}\n"
        fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, mark.encode())
        finally:
            os.close(fd)
        deadline = time.monotonic() + MARK_WAIT_S
        while True:
            with self.log.open("r", errors="replace") as f:
                f.seek(self._offset)
                text = f.read()
            end = text.find(mark)
            if end >= 0 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if end < 0:
            raise RuntimeError(f"validation log: marker {self._marks} did not come through {self.fifo}")
        self._offset += len(text[: end + len(mark)].encode(errors="replace"))
        chunk = text[:end]
        found = [line for line in chunk.splitlines() if line.strip() and not line.startswith(MARK)]
        errors = [line for line in found if "Validation Error" in line]
        self.errors_total += len(errors)
        return errors

    def close(self) -> None:
        """Stops the drain; the directory stays only when the layer reported errors (to read them)."""
        self.drain.terminate()
        self.drain.wait(timeout=10)
        if self.errors_total == 0:
            shutil.rmtree(self.dir, ignore_errors=True)


_log: ValidationLog | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _log
    if ENABLED and _log is None:
        # the loader also reads VK_LAYER_PATH / VK_ADD_LAYER_PATH (scripts/gpu-run.sh unpacks the layer under /tmp)
        extra = [d for var in ("VK_LAYER_PATH", "VK_ADD_LAYER_PATH") for d in os.environ.get(var, "").split(":") if d]
        if not any(Path(d, "VkLayer_khronos_validation.json").is_file() for d in (*extra, *LAYER_DIRS)):
            raise pytest.UsageError("VKACT_VALIDATION=1 needs the Khronos validation layer: apt-get install vulkan-validationlayers")
        _log = ValidationLog()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _log is not None:
        _log.close()


def pytest_report_header(config: pytest.Config) -> str | None:
    if _log is None:
        return None
    return f"Vulkan validation: {LAYER} + synchronization validation, log {_log.log}"


def _fail_on(errors: list[str], when: str) -> None:
    if errors:
        shown = "\n".join(errors[:10])
        pytest.fail(f"the Vulkan validation layer reported {len(errors)} error(s) {when}:\n{shown}", pytrace=False)


@pytest.fixture(autouse=True)
def _no_validation_errors() -> object:
    """Fails the test when the layer reported an error during it, or during the fixtures set up for it
    (a session fixture's errors land on the first test that uses it)."""
    if _log is not None:
        _fail_on(_log.messages_since_last_read(), "while this test's fixtures were set up")
    yield
    if _log is not None:
        _fail_on(_log.messages_since_last_read(), "during this test")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Errors after the last test (fixture teardown, exiting processes) fail the run too."""
    if _log is not None:
        late = _log.messages_since_last_read()
        if late:
            session.config.stash[_late] = late
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _write_run_report(session)


_late = pytest.StashKey[list]()
_outcomes: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Counts for the run report: a test's call outcome, or its set-up/teardown failure or skip."""
    if report.when == "call" or report.outcome != "passed":
        outcome = "error" if report.when != "call" and report.outcome == "failed" else report.outcome
        _outcomes[outcome] = _outcomes.get(outcome, 0) + 1


def _driver_package() -> str:
    """The Debian package (and version) of the one driver named by VK_ICD_FILENAMES, else ''."""
    icds = [x for x in os.environ.get("VK_ICD_FILENAMES", "").split(":") if x]
    if len(icds) != 1:
        return ""
    try:
        library = Path(icds[0]).parent / json.loads(Path(icds[0]).read_text())["ICD"]["library_path"]
        owner = subprocess.run(["dpkg", "-S", str(library.resolve())], capture_output=True, text=True, timeout=30)
        name = owner.stdout.split(":", 1)[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", name], capture_output=True, text=True, timeout=30)
        return f"{name} {version.stdout.strip()}" if name and version.returncode == 0 else ""
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        return ""


def _write_run_report(session: pytest.Session) -> None:
    """With VKACT_RUN_REPORT=path: what this run ran on and its results, as JSON (scripts/tested_on.py
    turns the reports of a portability run into the README's "Tested on" table)."""
    path = os.environ.get("VKACT_RUN_REPORT")
    if not path:
        return
    from service.vulkan_probe import choose, physical_devices

    try:
        d = choose(physical_devices(), os.environ.get("VKACT_DEVICE", "auto"))
        device = {"device": d.name, "driver": d.driver_name, "driver_info": d.driver_info, "vulkan": d.api_version}
    except LookupError as exc:
        device = {"device": str(exc), "driver": "", "driver_info": "", "vulkan": ""}
    report = {
        **device,
        "package": _driver_package(),
        "suite": os.environ.get("VKACT_RUN_SUITE", " ".join(session.config.args)),
        "memory": os.environ.get("VKACT_TEST_MEMORY", "host,device").replace(",", " + ") + " (engine); "
                  + os.environ.get("VKACT_MEMORY", "auto") + " (service)",
        "validation": _log is not None,
        "validation_errors": None if _log is None else _log.errors_total + len(session.config.stash.get(_late, [])),
        "exit_status": int(session.exitstatus),
        **{k: _outcomes.get(k, 0) for k in ("passed", "failed", "skipped", "error")},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _log is not None:
        terminalreporter.write_line(f"Vulkan validation errors: {_log.errors_total} (log {_log.log})")
        late = config.stash.get(_late, [])
        if late:
            terminalreporter.write_line(f"{len(late)} of them after the last test, first: {late[0]}")
