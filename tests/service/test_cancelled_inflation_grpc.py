"""End to end: a gRPC call reset by its client while its compressed message inflates gives the budget of
bytes in flight back whole (see test_cancelled_inflation: before, the steps inflated after the reset
were charged to a claim already released, and the budget lost them for the life of the process)."""
from __future__ import annotations

import gzip
import time

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc

from tests.service.conftest import start_server, stop_server
from tests.service.h2_client import H2Client
from tests.service.test_grpc_transport import INFER, relu_of, relu_request
from tests.service.test_process_faults import gauge

# Driver-independent (test-portability.sh leaves them to make test): the budget of a message inflating while its
# call is reset, before any kernel
pytestmark = pytest.mark.driver_independent

MESSAGE = 256 << 20  # inflated: long enough a thread's work for the reset to come in its middle


def settled(client) -> None:
    """The budget holds nothing once the calls have ended (their inflation stopped): polled for a while."""
    for _ in range(600):
        if gauge(client, "vkact_inflight_bytes") == 0:
            return
        time.sleep(0.05)
    assert gauge(client, "vkact_inflight_bytes") == 0, "a reset call's inflation kept bytes of the budget"


@pytest.mark.timeout(300)
def test_a_call_reset_while_its_message_inflates_gives_the_budget_back():
    server = start_server(max_body_bytes=2 * MESSAGE)
    try:
        x = np.zeros(MESSAGE // 4, np.float32)
        packed = gzip.compress(relu_request(x).SerializeToString(), 1)
        del x
        with server.client() as client:
            resets = 0
            for _ in range(5):  # until a reset lands while the thread inflates (the machine's load decides)
                settled(client)  # what an earlier try left has ended
                with H2Client(server.grpc) as h2:
                    sid = h2.start(INFER, [("grpc-encoding", "gzip")])
                    h2.send(sid, b"\1" + len(packed).to_bytes(4, "big") + packed)
                    for _ in range(2000):  # polled until its inflation is seen under way
                        held = gauge(client, "vkact_inflight_bytes")
                        if held > len(packed) + (8 << 20):
                            break
                    else:
                        continue  # not seen: another try
                    if held >= MESSAGE:
                        continue  # inflated whole before it was seen (the call ends with the connection): another try
                    h2.conn.reset_stream(sid)
                    h2._flush()
                    resets += 1
                    settled(client)
                    break
            assert resets == 1, "no reset came while the message inflated"
            y = np.linspace(-3, 3, 4096, dtype=np.float32)
            with grpc.insecure_channel(server.grpc) as ch:
                answer = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(relu_request(y), timeout=60, compression=grpc.Compression.Gzip)
            np.testing.assert_array_equal(relu_of(answer), np.maximum(y, 0))
    finally:
        stop_server(server)
