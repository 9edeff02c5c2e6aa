"""HTTP requests/s from wrk (Debian's wrk: one C thread, an event loop over N connections), the same for
every server: one fixed POST sent over and over, keep-alive, for a fixed duration.

wrk counts any answer; this one's Lua script checks each: a request counts as answered correctly only
when its status is 200 and its body is byte for byte the body of an answer checked before (by the
caller, against numpy). A run with any other answer raises ``Failed``, so no figure is of a broken path."""
from __future__ import annotations

import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

THREADS = 1

# %q quotes a Lua string literal; the script reads the request and the expected answer from files.
SCRIPT = """
wrk.method = "POST"
local function slurp(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end
wrk.body = slurp(%(body)s)
%(headers)s
local expected = slurp(%(answer)s)
bad, first_bad = 0, nil
local threads = {}
function setup(thread) table.insert(threads, thread) end
function response(status, headers, body)
  if status ~= 200 or body ~= expected then
    bad = bad + 1
    if first_bad == nil then first_bad = status .. " " .. string.sub(body or "", 1, 200) end
  end
end
function done(summary, latency, requests)
  local n, why = 0, ""
  for _, t in ipairs(threads) do n = n + t:get("bad"); why = t:get("first_bad") or why end
  io.write(string.format("VKACT-BAD %%d %%s\\n", n, why))
  io.write(string.format("VKACT-P50 %%d\\nVKACT-P99 %%d\\n", latency:percentile(50), latency:percentile(99)))
end
"""


class Failed(RuntimeError):
    """wrk is missing, failed, or saw an answer other than the checked one."""


@dataclass(frozen=True)
class WrkRun:
    requests: int
    seconds: float
    cpu_seconds: float      # wrk's own user + system CPU
    p50_s: float            # latency under load
    p99_s: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds


def _lua(text: str) -> str:
    return '"' + "".join(c if c.isalnum() or c in "/._-:; =" else f"\\{ord(c):03d}" for c in text) + '"'


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(url: str, body: bytes, headers: dict[str, str], answer: bytes, connections: int, seconds: float) -> WrkRun:
    """wrk POSTing ``body`` with ``headers`` to ``url`` (the full URL) on ``connections`` connections
    from one thread for ``seconds``; every answer must be ``answer`` (status 200)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise Failed("wrk not found (Debian package wrk; bench/tools.py installs it)")
    with tempfile.TemporaryDirectory(prefix="vkact-wrk-") as tmp:
        (Path(tmp) / "body").write_bytes(body)
        (Path(tmp) / "answer").write_bytes(answer)
        head = "\n".join(f"wrk.headers[{_lua(k)}] = {_lua(v)}" for k, v in headers.items())
        script = Path(tmp) / "post.lua"
        script.write_text(SCRIPT % {"body": _lua(str(Path(tmp) / "body")), "answer": _lua(str(Path(tmp) / "answer")),
                                    "headers": head})
        cpu = _children_cpu()
        done = subprocess.run([wrk, "-t", str(THREADS), "-c", str(connections), "-d", f"{seconds:g}s", "--timeout", "30s",
                               "-s", str(script), url], capture_output=True, text=True, timeout=seconds + 60)
        cpu = _children_cpu() - cpu
    out = done.stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", out)
    bad = re.search(r"VKACT-BAD (\d+) ?(.*)", out)
    p50, p99 = re.search(r"VKACT-P50 (\d+)", out), re.search(r"VKACT-P99 (\d+)", out)
    if done.returncode != 0 or not (total and bad and p50 and p99):
        raise Failed(f"wrk failed ({done.returncode}): {(done.stderr or out)[-400:]}")
    errors = re.search(r"Socket errors: (.*)", out)
    if int(bad.group(1)) or errors:
        raise Failed(f"{bad.group(1)} answers differ from the checked one (first: {bad.group(2)[:200]!r})"
                     + (f"; socket errors: {errors.group(1)}" if errors else ""))
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[total.group(3)]
    return WrkRun(int(total.group(1)), float(total.group(2)) * scale, cpu, int(p50.group(1)) * 1e-6, int(p99.group(1)) * 1e-6)
