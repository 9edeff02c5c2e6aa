"""ModelStreamInfer, Triton's bidirectional stream, through tritonclient.grpc unchanged (sync start_stream
and the asyncio stream_infer): one response per request, each with its id, results against numpy; a
request's failure is its response's error_message and the stream goes on; the stream's requests are
counted as ModelInfer's; a client that leaves mid-stream leaves the service serving."""
from __future__ import annotations

import asyncio
import queue
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.service.test_v2 import reference
from tests.service.test_v2_errors import assert_still_serving

MODEL = "scaled_elu"  # its statistics move only in this module


def request_for(k: int) -> tuple[np.ndarray, list[tg.InferInput]]:
    x = np.random.default_rng(k).standard_normal(64 + k).astype(np.float32)
    return x, [tg.InferInput("InputTensor", list(x.shape), "FP32").set_data_from_numpy(x)]


def test_sync_stream_answers_every_request_by_id(server, http):
    """As perf_analyzer --streaming drives it: requests sent one after another without waiting, each
    with its own id, matched to their responses by id; an unknown model in the middle fails alone."""
    answers: queue.Queue = queue.Queue()
    client = tg.InferenceServerClient(server.grpc)
    sent = {}
    before = client.get_inference_statistics(MODEL).model_stats[0].inference_stats.success.count
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for k in range(40):
            x, inputs = request_for(k)
            sent[str(k)] = x
            client.async_stream_infer(MODEL, inputs, request_id=str(k), parameters={"Alpha": 1.5})
            if k == 20:
                client.async_stream_infer("nope", inputs, request_id="bad")
        got, errors = {}, []
        for _ in range(41):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(error)
                continue
            response = result.get_response()
            got[response.id] = result.as_numpy("OutputTensor")
            assert response.model_name == MODEL and response.model_version == "1"
    finally:
        client.stop_stream()
        client.close()
    assert [e.message() for e in errors] == [errors[0].message()] and "unknown model 'nope'" in errors[0].message()
    assert set(got) == set(sent)
    for key, x in sent.items():
        np.testing.assert_allclose(got[key], reference(MODEL, {"InputTensor": x}, Alpha=1.5), rtol=1e-5, atol=1e-6)
    with tg.InferenceServerClient(server.grpc) as after:
        assert after.get_inference_statistics(MODEL).model_stats[0].inference_stats.success.count - before == 40
    assert_still_serving(http)


def test_perf_analyzer_stream_sequence(server):
    """perf_analyzer --streaming's requests: numbered ids, several in flight, final-response flags asked
    for (triton_enable_empty_final_response); each answer is its request's only one, flagged final, as
    Triton answers for a model that is not decoupled."""
    answers: queue.Queue = queue.Queue()
    x = np.linspace(-2, 2, 256, dtype=np.float32)
    with tg.InferenceServerClient(server.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            for k in range(1, 9):
                inp = tg.InferInput("InputTensor", [1, 256], "FP32").set_data_from_numpy(x.reshape(1, 256))  # -b 1
                client.async_stream_infer(MODEL, [inp], request_id=str(k), enable_empty_final_response=True)
            seen = set()
            for _ in range(8):
                result, error = answers.get(timeout=60)
                assert error is None, error
                response = result.get_response()
                assert response.parameters["triton_final_response"].bool_param
                np.testing.assert_allclose(result.as_numpy("OutputTensor").reshape(-1), reference(MODEL, {"InputTensor": x}), rtol=1e-5, atol=1e-6)
                seen.add(response.id)
            assert seen == {str(k) for k in range(1, 9)}
        finally:
            client.stop_stream()  # waits for the stream's end: no empty final response follows
        assert answers.empty()


def test_aio_stream(server):
    async def run() -> dict[str, np.ndarray]:
        sent: dict[str, np.ndarray] = {}

        async def requests():
            for k in range(16):
                x = np.linspace(-3, 3, 8 + k, dtype=np.float32)
                sent[f"r{k}"] = x
                inp = tg_aio.InferInput("InputTensor", list(x.shape), "FP32").set_data_from_numpy(x)
                yield {"model_name": MODEL, "inputs": [inp], "request_id": f"r{k}"}
                await asyncio.sleep(0)

        got = {}
        async with tg_aio.InferenceServerClient(server.grpc) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                got[result.get_response().id] = result.as_numpy("OutputTensor")
        assert set(got) == set(sent)
        for key, x in sent.items():
            np.testing.assert_allclose(got[key], reference(MODEL, {"InputTensor": x}), rtol=1e-5, atol=1e-6)
        return got

    assert len(asyncio.run(run())) == 16


def test_raw_stream_errors_and_half_close(server):
    """On the raw stub: a malformed message and a bad tensor are answered in the stream (the bad one
    with its id), the stream ends OK once the client has half-closed and everything is answered; a
    stream with no request at all ends OK at once."""
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        good = service_pb2.ModelInferRequest(model_name=MODEL, id="good")
        good.inputs.add(name="InputTensor", datatype="FP32", shape=[2]).contents.fp32_contents.extend([-1.0, 1.0])
        bad = service_pb2.ModelInferRequest(model_name=MODEL, id="short")
        bad.inputs.add(name="InputTensor", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0])
        garbage = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                        request_serializer=lambda b: b, response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        answers = list(garbage(iter([b"\xff\xff", good.SerializeToString(), bad.SerializeToString()]), timeout=60))
        by_id = {a.infer_response.id: a for a in answers}
        assert len(answers) == 3 and set(by_id) == {"", "good", "short"}
        assert "not a inference.ModelInferRequest" in by_id[""].error_message
        assert by_id["good"].error_message == ""
        np.testing.assert_allclose(np.frombuffer(by_id["good"].infer_response.raw_output_contents[0], np.float32),
                                   reference(MODEL, {"InputTensor": np.array([-1.0, 1.0], np.float32)}), rtol=1e-6)
        assert "data holds 1 values; the shape holds 3" in by_id["short"].error_message and by_id["short"].infer_response.model_name == MODEL
        assert list(stub.ModelStreamInfer(iter([]), timeout=60)) == []


def test_a_client_that_leaves_mid_stream(server, http):
    """Requests still running when the client cancels its stream are dropped; nothing leaks, the
    service answers the next stream."""
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        big = service_pb2.ModelInferRequest(model_name=MODEL, id="big")
        big.inputs.add(name="InputTensor", datatype="FP32", shape=[1 << 19])  # 2 MiB: within grpcio's receive limit
        big.raw_input_contents.append(np.ones(1 << 19, np.float32).tobytes())

        def requests():
            for _ in range(8):
                yield big
            time.sleep(30)  # the stream stays open: the client cancels it

        call = stub.ModelStreamInfer(requests(), timeout=60)
        first = next(call)
        assert first.error_message == "" and first.infer_response.id == "big"
        call.cancel()
        with pytest.raises(grpc.RpcError) as info:
            list(call)
        assert info.value.code() == grpc.StatusCode.CANCELLED
    test_raw_stream_errors_and_half_close(server)
    assert_still_serving(http)


def test_a_long_stream_gives_each_message_back_to_the_budget():
    """A stream's messages leave the process's budget of bytes in flight once its call has taken them:
    forty 64 KiB requests, one after another, on a stream of a server whose budget is 256 KiB all succeed
    (held for the stream's life, the fifth would be refused)."""
    from tests.service.conftest import start_server, stop_server

    server = start_server(inflight_bytes=256 << 10, max_body_bytes=128 << 10)
    try:
        answers: queue.Queue = queue.Queue()
        x = np.linspace(-2, 2, 16 << 10, dtype=np.float32)  # 64 KiB
        with tg.InferenceServerClient(server.grpc) as client:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            try:
                for k in range(40):
                    inp = tg.InferInput("InputTensor", [x.size], "FP32").set_data_from_numpy(x)
                    client.async_stream_infer(MODEL, [inp], request_id=str(k))
                    result, error = answers.get(timeout=60)
                    assert error is None, (k, error)
                    assert result.get_response().id == str(k)
                np.testing.assert_allclose(result.as_numpy("OutputTensor"), reference(MODEL, {"InputTensor": x}), rtol=1e-5, atol=1e-6)
            finally:
                client.stop_stream()
    finally:
        stop_server(server)


def held_servicer():
    """InferenceServicer whose ModelInfer answers a request once its id is released: what the stream
    does around the execution path, in-process, with the timing in the test's hands."""
    from service.api.grpc.server import InferenceServicer

    class Held(InferenceServicer):
        def __init__(self) -> None:
            self.released: dict[str, asyncio.Event] = {}

        async def ModelInfer(self, request):
            await self.released.setdefault(request.id, asyncio.Event()).wait()
            return service_pb2.ModelInferResponse(id=request.id, model_name=request.model_name).SerializeToString()

    return Held()


def _stream_run(ids: list[str], release_order: list[str]) -> list:
    from service.api.grpc.messages import pb

    servicer = held_servicer()
    sent: list = []

    async def run() -> None:
        async def requests():
            for i in ids:
                yield service_pb2.ModelInferRequest(model_name=MODEL, id=i).SerializeToString()

        call = asyncio.ensure_future(servicer.ModelStreamInfer(requests(), lambda b: sent.append(pb.ModelStreamInferResponse.FromString(b))))
        for _ in range(3):
            await asyncio.sleep(0)
        for i in release_order:
            servicer.released.setdefault(i, asyncio.Event()).set()
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.wait_for(call, 10)

    asyncio.run(run())
    return sent


def test_answers_come_in_order_of_completion():
    sent = _stream_run(["slow", "fast", "middle"], ["fast", "middle", "slow"])
    assert [a.infer_response.id for a in sent] == ["fast", "middle", "slow"] and not any(a.error_message for a in sent)


def test_requests_beyond_the_streams_bound_are_answered_with_an_error():
    from service.api.grpc.server import STREAM_IN_FLIGHT

    ids = [str(k) for k in range(STREAM_IN_FLIGHT + 2)]
    sent = _stream_run(ids, ids)
    refused = [a for a in sent if a.error_message]
    assert len(refused) == 2 and all(f"more than {STREAM_IN_FLIGHT} requests" in a.error_message for a in refused)
    assert sorted(a.infer_response.id for a in sent if not a.error_message) == sorted(ids[:STREAM_IN_FLIGHT])


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_stream(server, compression):
    """A stream whose messages are compressed (grpc-encoding): each is inflated on its own."""
    answers: queue.Queue = queue.Queue()
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    with tg.InferenceServerClient(server.grpc) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)), compression_algorithm=compression)
        try:
            for k in range(3):
                inp = tg.InferInput("InputTensor", [x.size], "FP32").set_data_from_numpy(x * (k + 1))
                client.async_stream_infer(MODEL, [inp], request_id=str(k))
            got = {}
            for _ in range(3):
                result, error = answers.get(timeout=60)
                assert error is None, error
                got[result.get_response().id] = result.as_numpy("OutputTensor")
        finally:
            client.stop_stream()
    for k in range(3):
        np.testing.assert_allclose(got[str(k)], reference(MODEL, {"InputTensor": x * (k + 1)}), rtol=1e-5, atol=1e-6)
