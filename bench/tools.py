"""The bench's own system tools, installed from Debian on first use: ``wrk`` (HTTP load, bench/wrk.py)
and ``perf`` (linux-perf, bench/profile.py). The tests need neither, so scripts/setup.sh leaves them out;
py-spy comes from PyPI with the bench extra (pyproject.toml)."""
from __future__ import annotations

import os
import shutil
import subprocess

PACKAGES = {"wrk": "wrk", "perf": "linux-perf"}   # executable -> Debian package


class Missing(RuntimeError):
    """A tool is not installed and cannot be installed here; the message says how to."""


def ensure(*executables: str) -> dict[str, str]:
    """The paths of ``executables``, installing the missing ones' packages with apt-get (as root, or
    through sudo); raises Missing with the command to run when that cannot be done."""
    missing = [PACKAGES[e] for e in executables if shutil.which(e) is None]
    if missing:
        command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
        if sudo is None or shutil.which("apt-get") is None:
            raise Missing(f"not installed: {', '.join(missing)} (as root: {' '.join(command)})")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run([*sudo, *command], capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:   # a stale package list: update it once and try again
            subprocess.run([*sudo, "apt-get", "update", "-q"], capture_output=True, env=env, timeout=600)
            done = subprocess.run([*sudo, *command], capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            raise Missing(f"apt-get could not install {', '.join(missing)}: {done.stderr.strip()[-300:]}")
    found = {e: shutil.which(e) for e in executables}
    absent = [e for e, path in found.items() if path is None]
    if absent:
        raise Missing(f"{', '.join(absent)} not found after installing {', '.join(missing)}")
    return {e: str(path) for e, path in found.items()}
