"""Processes that die: the device worker under in-flight requests (a transient 503 with Retry-After,
not a 500), and the HTTP process itself (the supervisor of ``python -m service`` restarts it)."""
from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.service.conftest import start_server, stop_server
from tests.service.helpers import binary_request, request_body
from tests.service.test_load import await_restarted_worker, one_request, worker_pid


def gauge(client: httpx.Client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", client.get("/metrics").text, re.M)
    assert match, name
    return float(match[1])


@pytest.mark.timeout(120)
def test_in_flight_requests_of_a_dying_worker_get_503_with_retry_after():
    server = start_server()
    try:
        with server.client() as client, ThreadPoolExecutor(2) as pool:
            one_request(client, 1)
            pid = worker_pid(server)
            os.kill(pid, signal.SIGSTOP)  # the jobs reach its pipe and stay there
            x = np.ones(64, np.float32)
            body, headers = binary_request(request_body("SOFTSIGN", x), x.view(np.uint8))
            with server.client() as other:
                answers = [pool.submit(c.post, "/v1/execute", content=body, headers=headers) for c in (client, other)]
                for _ in range(600):
                    if gauge(client, "vkact_queue_depth") == 2:
                        break
                    time.sleep(0.01)
                os.kill(pid, signal.SIGKILL)
                responses = [a.result(60) for a in answers]
            for response in responses:
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert "device worker exited" in response.json()["error"]
            await_restarted_worker(client, 60)
            for i in range(3):
                one_request(client, i)
            assert 'vkact_errors_total{code="500"}' not in client.get("/metrics").text
    finally:
        stop_server(server)
