"""The direct HTTP/1.1 path for /v2 requests sent as JSON (service/api/v2/json_repeat.py): a request whose
structure (everything but its tensors' values) repeats is answered without ASGI, byte for byte as the
route answers it; a request whose values the route's checks refuse, or that is not the plain case, is the
route's, answered as before. In-process, as test_http_direct: the protocol on a recording transport, the
device worker stubbed to echo its first input (the numerics over the real worker are test_http_native's
and the JSON cases of test_v2)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from client.codec import HEADER_LENGTH
from service.http_direct import DirectCycle
from tests.service.test_http_direct import Harness, answers, comparable, http, settle


def json_request(values, datatype: str = "FP32", shape=None, model: str = "identity", extra: dict | None = None,
                 tensor_extra: dict | None = None) -> bytes:
    tensor = {"name": "InputTensor", "shape": shape if shape is not None else [len(values)], "datatype": datatype, "data": values,
              **(tensor_extra or {})}
    return http(f"/v2/models/{model}/infer", json.dumps({"inputs": [tensor], **(extra or {})}).encode(), {"Content-Type": "application/json"})


def served(requests: list[bytes], direct: bool) -> tuple[list[tuple[int, dict, bytes]], list[bool]]:
    """Each request on one connection, one after another: the answers, and whether each was on the direct path."""
    async def run():
        harness = Harness()
        proto, transport = harness.connect(direct)
        kinds = []
        for request in requests:
            proto.data_received(request)
            await settle(proto)
            kinds.append(type(proto.cycle) is DirectCycle)
        return [comparable(a) for a in answers(transport.written)], kinds

    return asyncio.run(run())


def flat(values: list) -> list:
    return [v for row in values for v in flat(row)] if values and type(values[0]) is list else values


x = np.linspace(-2, 2, 12, dtype=np.float32)
CASES = {
    "FP32": [json_request((x + i).tolist()) for i in range(3)],
    "FP32 nested": [json_request((x + i).reshape(3, 4).tolist(), shape=[3, 4]) for i in range(3)],
    "FP16": [json_request((x * i).astype(np.float16).tolist(), "FP16") for i in range(3)],
    "INT8": [json_request(list(range(-6 + i, 6 + i)), "INT8", model="shrink") for i in range(3)],
    "non-finite": [json_request([1.5, "NaN", "Infinity", "-Infinity", -0.0, i]) for i in range(3)],
    "FP32 edges": [json_request(np.array([1e-45, 3.4028234663852886e38, -0.0, 0.1, 1.1754943508222875e-38, -2.5 * i], np.float32).tolist())
                   for i in range(3)],
    "FP64": [json_request([1e-310, 1.7976931348623157e308, -0.0, 0.1, 5e-324, float(i)], "FP64") for i in range(3)],
    "BF16": [json_request([1.5, -2.0, 0.0078125, 3.0e38 * 0, 256.0, float(i)], "BF16") for i in range(3)],
    "INT64": [json_request([-2**63, 2**63 - 1, 0, -1, i], "INT64", model="shrink") for i in range(3)],
    "UINT64": [json_request([0, 2**64 - 1, 2**53 + 1, i], "UINT64", model="shrink") for i in range(3)],
    "SHRINK parameters": [json_request((x + i).tolist(), model="shrink", extra={"parameters": {"Bias": 0.25, "Threshold": 0.75}})
                          for i in range(3)],
    "outputs named": [json_request((x - i).tolist(), extra={"outputs": [{"name": "OutputTensor"}]}) for i in range(3)],
    "an id each": [json_request((x + i).tolist(), extra={"id": f"request-{i}"}) for i in range(3)],
    "a null id": [json_request((x + i).tolist(), extra={"id": None}) for i in range(3)],
    "binary output asked": [json_request((x + i).tolist(), extra={"parameters": {"binary_data_output": True}}) for i in range(3)],
    "binary output, an id": [json_request((x + i).tolist(), extra={"id": str(i), "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]})
                             for i in range(3)],
}


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_repeated_json_requests_take_the_direct_path_and_answer_as_the_route(case):
    requests = CASES[case]
    direct, kinds = served(requests, True)
    route, route_kinds = served(requests, False)
    assert kinds == [True] * len(requests) and route_kinds == [False] * len(requests)
    assert direct == route
    for (status, headers, body), request in zip(direct, requests):
        assert status == 200, body
        sent = json.loads(request.partition(b"\r\n\r\n")[2])
        values = flat(sent["inputs"][0]["data"])
        if HEADER_LENGTH.lower() in headers:  # asked as binary data: the JSON header, then the output's bytes
            n = int(headers[HEADER_LENGTH.lower()])
            head, data = json.loads(body[:n]), body[n:]
            assert headers["content-type"] == "application/octet-stream" and data == np.array(values, np.float32).tobytes()
        else:
            head = json.loads(body)
            assert headers["content-type"] == "application/json" and head["outputs"][0]["data"] == values  # the echo
        assert head.get("id") == sent.get("id")


REFUSED = {
    "a string": ["x"] + x.tolist()[1:],
    "a boolean": [True] + x.tolist()[1:],
    "too few values": x.tolist()[:-1],
    "past FP32": [1e39] + x.tolist()[1:],
    "a ragged row": [x.tolist()[:6], x.tolist()[6:11]],
}


@pytest.mark.parametrize("case", REFUSED, ids=REFUSED)
def test_values_the_checks_refuse_are_the_routes_400_after_the_structure_was_seen(case):
    requests = [json_request(x.tolist()), json_request(REFUSED[case], shape=[12]), json_request((x + 1).tolist())]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert direct == route
    assert [status for status, _, _ in direct] == [200, 400, 200]
    assert json.loads(direct[1][2])["error"]
    assert kinds == [True, False, True]  # the refused one answered on the route's cycle


LEFT = {
    "an id not a string": {"extra": {"id": 7}},
    "an input parameter": {"tensor_extra": {"parameters": {}}},
    "an output in shared memory": {"extra": {"outputs": [{"name": "OutputTensor", "parameters": {
        "shared_memory_region": "nowhere", "shared_memory_byte_size": 48}}]}},
}


@pytest.mark.parametrize("case", LEFT, ids=LEFT)
def test_requests_that_are_not_the_plain_case_are_the_routes(case):
    requests = [json_request((x + i).tolist(), **LEFT[case]) for i in range(2)]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert kinds == [False, False]
    expected = {"an id not a string": 400, "an input parameter": 200, "an output in shared memory": 404}[case]  # no such region
    assert direct == route and [status for status, _, _ in direct] == [expected] * 2


def test_a_connection_whose_json_requests_change_shape_is_answered_for_each():
    requests = [json_request(x[:n].tolist()) for n in (12, 5, 12, 1, 5)] + [json_request(x.tolist(), "FP16")]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert all(kinds) and direct == route
    assert [len(json.loads(body)["outputs"][0]["data"]) for _, _, body in direct] == [12, 5, 12, 1, 5, 12]


@pytest.mark.parametrize("place", ["parameters", "outputs", "Bias"])
def test_a_bare_non_finite_number_is_not_taken_for_the_null_seen_before(place):
    """orjson writes a float NaN or Infinity (the json module parses the bare tokens) as null: the structure of
    a request with one must not be the key of the same request with null, which the route answers otherwise."""
    def request(value, i: int) -> bytes:
        extra = {"parameters": {"Bias": value}} if place == "Bias" else {place: value}
        return json_request((x + i).tolist(), model="shrink", extra=extra)

    requests = [request(None, 0), request(float("inf"), 1), request(float("nan"), 2), request(-float("inf"), 3)]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert direct == route
    assert [status for status, _, _ in direct][1:] == [400, 400, 400]
    assert not any(kinds)  # null or not finite: the route's, each


def test_inputs_sent_out_of_the_descriptors_order_are_each_where_the_descriptor_says():
    """RELU_GRAD's InputTensor and InputGradientTensor, sent gradient first: the echo answers InputTensor's values."""
    def request(i: int) -> bytes:
        tensors = [{"name": "InputGradientTensor", "shape": [4], "datatype": "FP32", "data": [5.0 + i, 6, 7, 8]},
                   {"name": "InputTensor", "shape": [4], "datatype": "FP32", "data": [1.0 + i, 2, 3, 4]}]
        return http("/v2/models/relu_grad/infer", json.dumps({"inputs": tensors}).encode(), {})

    requests = [request(i) for i in range(3)]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert all(kinds) and direct == route
    assert [json.loads(body)["outputs"][0]["data"] for _, _, body in direct] == [[1.0 + i, 2, 3, 4] for i in range(3)]


def test_one_body_sent_to_two_models_is_answered_by_each():
    body = json.dumps({"inputs": [{"name": "InputTensor", "shape": [12], "datatype": "FP32", "data": x.tolist()}]}).encode()
    requests = [http(f"/v2/models/{model}/infer", body, {}) for model in ("identity", "relu", "identity", "sigmoid")]
    direct, kinds = served(requests, True)
    route, _ = served(requests, False)
    assert all(kinds) and direct == route
    assert [json.loads(body)["model_name"] for _, _, body in direct] == ["identity", "relu", "identity", "sigmoid"]


def test_a_json_job_sent_at_once_is_answered_from_its_reply_without_a_task():
    from tests.service.test_http_direct_now import FastEcho, until

    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = harness.connect()
        proto.data_received(CASES["an id each"][0])
        sent = (type(proto.cycle) is DirectCycle, len(proto.tasks), len(worker.jobs), worker.runs)
        worker.reply()
        await until(lambda: len(answers(transport.written)) == 1)
        return harness, sent, worker, answers(transport.written)

    harness, sent, worker, got = asyncio.run(run())
    assert sent == (True, 0, 1, 0)  # its first request already: no task, its job sent from data_received
    route, _ = served(CASES["an id each"][:1], False)
    assert [comparable(a) for a in got] == route
    assert all(job.released for job in worker.jobs) and harness.stats("identity").nv_inference_request_success == 1
