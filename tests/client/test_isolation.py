"""The client installs without the service: it may import numpy and httpx, never service/ or pydantic,
and it works without orjson (which it uses when present)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
sys.modules["service"] = None  # any `import service...` now raises ImportError
sys.modules["orjson"] = None   # as where only the client is installed
import httpx, numpy as np
import client
from client import Client
from client import codec

def handler(request):
    header, _ = codec.split_frame(request.content, request.headers.get(codec.HEADER_LENGTH))
    desc = header["Operator"]["InputTensor"]
    return httpx.Response(200, json={"Operator": header["Operator"]["Type"], "OutputTensor": desc, "Output": [-1.0, -2.0]})

assert codec.orjson is None and codec.parse_header(memoryview(b'{"x": NaN}'))["x"] != 0
with Client(transport=httpx.MockTransport(handler)) as vk:
    assert vk.celu(np.array([1.0, 2.0], np.float32), alpha=2.0).tolist() == [-1.0, -2.0]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("service", "pydantic", "kp", "fastapi") and sys.modules[m] is not None)
assert not loaded, loaded
print("ok")
"""


def test_client_imports_without_the_service() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
