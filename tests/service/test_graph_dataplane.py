"""The data plane's graph execution (service/dataplane/graphs.py) on a real device worker process: inputs
by their edges' names (arrays, or a Source writing into the slot), outputs by their edges' names,
bit-identical to the graph's nodes run one by one as ordinary jobs; every error names its input or field
and leaves the worker serving; the bookkeeping counts a graph once."""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time

import numpy as np
import pytest

from service.api.header_cache import HeaderCache
from service.api.runtime import Runtime
from service.config import Settings
from service.dataplane import graphs
from service.dataplane.deadlines import Deadlines
from service.dataplane.graph_models import GraphModels
from service.dataplane.metrics import Metrics
from service.descriptors.graph import parse_graph
from service.errors import DescriptorError, InvalidRequest, PayloadTooLarge, Timeout, UnknownOperator, UnsupportedOnDevice
from service.shared_memory import SharedMemoryRegistry
from service.worker import DeviceWorker
from tests.graph_helpers import SIZES, activation, chain, linear_tanh_shrink_dict, node_by_node_async, sample, shared_intermediate


async def _node_by_node(worker: DeviceWorker, graph, x: np.ndarray) -> dict[str, bytes]:
    """The oracle: each node an ordinary job on the worker."""
    async def run(n: int, args: list[bytes]) -> bytes:
        result = await worker.run(graph.operators[n], [np.frombuffer(a, np.uint8) for a in args], False)
        try:
            return bytes(result.output)
        finally:
            result.release()

    return await node_by_node_async(run, graph, [x.tobytes()])


class _Source:
    """A Source as shared memory hands one to the worker: it writes the bytes into the slot itself."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.nbytes = data.nbytes
        self.filled = 0

    async def fill(self, dst: np.ndarray) -> None:
        dst[...] = self.data
        self.filled += 1


def _runtime(settings: Settings) -> Runtime:
    path = os.path.join(tempfile.mkdtemp(), "regions.json")
    return Runtime(settings, Metrics(), SharedMemoryRegistry(path), HeaderCache(), HeaderCache())


def _with_state(scenario, **settings) -> None:
    async def main() -> None:
        state = _runtime(Settings(pin_cpu="off", **settings))  # in-process: never pin the test runner's thread
        worker = state.worker = DeviceWorker(state.settings)
        worker.on_execution = state.metrics.triton.execution   # as the app wires it: a graph job must not upset it
        worker.start()
        await worker.wait_ready(60)
        try:
            await scenario(state)
        finally:
            await worker.close()

    asyncio.run(main())


@pytest.mark.timeout(180)
def test_outputs_by_name_are_the_nodes_one_by_one():
    async def scenario(state: Runtime) -> None:
        graph = graphs.parse(shared_intermediate(np.float32).model_dump(mode="json"), state.settings)
        compiled = await graphs.compile_graph(state.settings, graph)
        assert await graphs.compile_graph(state.settings, graph) is compiled   # cached: neither compiled nor pickled again
        assert compiled.report.fused and compiled.report.dispatches == 1 and compiled.report.nodes == 3
        x = sample(np.float32)
        expected = await _node_by_node(state.worker, graph, x)
        source = _Source(x.reshape(-1).view(np.uint8))
        for given in (x.reshape(-1).view(np.uint8), source):
            started = time.perf_counter()
            answer = await graphs.run_graph(state, compiled, {"x": given})
            assert answer is not None
            assert list(answer.outputs) == ["s", "p", "l"]            # graph output index order
            assert {name: bytes(view) for name, view in answer.outputs.items()} == expected
            assert answer.bytes_in == x.nbytes and answer.bytes_out == 3 * x.nbytes
            graphs.record_graph_success(state, started, answer)
            answer.release()
        assert source.filled == 1
        series = state.metrics.operator(graphs.GRAPH_LABEL)
        assert series.ok == 2 and series.bytes_in == 2 * x.nbytes
        # a plain GraphPlan runs too (what a caller holding only the plan passes)
        answer = await graphs.run_graph(state, compiled.plan, {"x": x.reshape(-1).view(np.uint8)})
        assert bytes(answer.outputs["p"]) == expected["p"]
        answer.release()

    _with_state(scenario)


@pytest.mark.timeout(180)
def test_every_error_names_its_input_or_field_and_the_worker_serves_on():
    async def scenario(state: Runtime) -> None:
        graph = graphs.parse(shared_intermediate(np.float32).model_dump(mode="json"), state.settings)
        compiled = await graphs.compile_graph(state.settings, graph)
        x = sample(np.float32).reshape(-1).view(np.uint8)
        cases = [
            ({}, "Inputs.x", "missing"),
            ({"x": x, "z": x}, "Inputs.z", "no input 'z'"),
            ({"x": x[:-4]}, "Inputs.x", "TotalTensorSizeInBytes"),
            ({"x": _Source(np.zeros(x.nbytes + 4, np.uint8))}, "Inputs.x", "TotalTensorSizeInBytes"),
        ]
        for inputs, field, words in cases:
            with pytest.raises(InvalidRequest) as err:
                await graphs.run_graph(state, compiled, inputs)
            assert err.value.status == 400 and err.value.field == field and words in err.value.message
        with pytest.raises(InvalidRequest) as err:
            await graphs.run_graph(state, compiled, {}, field="inputs")
        assert err.value.field == "inputs.x"

        # an output declared larger than its input: what /v1 refuses for one operator, per node
        relu = activation("RELU", np.float32, SIZES)
        relu["OutputTensor"] = {**relu["InputTensor"], "TotalTensorSizeInBytes": 1 << 20}
        big = await graphs.compile_graph(state.settings, graphs.parse(chain([relu]), state.settings))
        with pytest.raises(DescriptorError) as err:
            await graphs.run_graph(state, big, {"x": x})
        assert err.value.field == "Graph.Nodes[0].Operator.OutputTensor.TotalTensorSizeInBytes"
        # beyond the device's binding limit: named from Graph
        huge = activation("RELU", np.float32, SIZES)
        huge["InputTensor"]["TotalTensorSizeInBytes"] = 1 << 40
        huge["OutputTensor"] = dict(huge["InputTensor"])
        with pytest.raises(UnsupportedOnDevice) as err:
            await graphs.run_graph(state, await graphs.compile_graph(state.settings, graphs.parse(chain([huge]), state.settings)), {"x": x})
        assert err.value.field == "Graph.Nodes[0].Operator.InputTensor.TotalTensorSizeInBytes"

        answer = await graphs.run_graph(state, compiled, {"x": x})   # still serving
        assert answer is not None and len(answer.outputs) == 3
        answer.release()

    _with_state(scenario)


@pytest.mark.timeout(180)
def test_the_buffer_pool_bounds_a_graph_before_device_work():
    async def scenario(state: Runtime) -> None:
        sizes = (1 << 18,)   # 1 MiB per FLOAT32 tensor: 9 tensors of 1 MiB need more than the 8 MiB pool
        nodes = [activation("RELU", np.float32, sizes) for _ in range(8)]
        compiled = await graphs.compile_graph(state.settings, graphs.parse(chain(nodes), state.settings))
        with pytest.raises(PayloadTooLarge) as err:
            await graphs.run_graph(state, compiled, {"x": np.zeros(1 << 20, np.uint8)})
        assert err.value.field == "Graph" and "VKACT_POOL_BYTES" in err.value.message

    _with_state(scenario, pool_bytes=8 << 20)


@pytest.mark.timeout(180)
def test_a_client_gone_or_a_timeout_drops_the_job_and_frees_its_slot():
    async def scenario(state: Runtime) -> None:
        sizes = (1 << 19,)   # 2 MiB inputs: large enough that the client's departure is watched
        compiled = await graphs.compile_graph(state.settings, graphs.parse(chain([activation("RELU", np.float32, sizes)]), state.settings))
        x = np.ones(1 << 21, np.uint8)

        async def gone() -> None:
            return None

        assert await graphs.run_graph(state, compiled, {"x": x}, departure=gone) is None
        patient = state.deadlines
        state.deadlines = Deadlines(1e-6)   # the request timeout, on the timer every execution shares
        with pytest.raises(Timeout):
            await graphs.run_graph(state, compiled, {"x": x})
        state.deadlines = patient
        for _ in range(200):   # a job already on the device hands its slot back when it ends
            if state.worker.queue_depth == 0:
                break
            await asyncio.sleep(0.05)
        assert state.worker.queue_depth == 0
        answer = await graphs.run_graph(state, compiled, {"x": np.zeros(1 << 21, np.uint8)})
        assert answer is not None and bytes(answer.outputs["y"]) == bytes(1 << 21)
        answer.release()
        assert state.worker.queue_depth == 0

    _with_state(scenario)


def test_parse_refuses_what_is_no_graph_and_too_many_nodes():
    settings = Settings(max_graph_nodes=2)
    with pytest.raises(DescriptorError) as err:
        graphs.parse([1, 2], settings)
    assert err.value.field == "Graph"
    three = chain([activation("RELU", np.float32, SIZES)] * 3)
    with pytest.raises(DescriptorError) as err:
        graphs.parse(three, settings)
    assert err.value.field == "Graph.Nodes" and "VKACT_MAX_GRAPH_NODES" in err.value.message
    assert graphs.parse(three, Settings()).Nodes[2].Operator == parse_graph(three).Nodes[2].Operator


def test_the_report_as_parameters():
    report = graphs.GraphReport(False, 3, 3, ("Nodes[1] (X) has strided or broadcast tensors: it runs with its own kernel",))
    assert report.parameters() == {"graph_fused": "false", "graph_dispatches": "3", "graph_nodes": "3",
                                   "graph_notes": report.notes[0]}


@pytest.mark.timeout(180)
def test_a_graph_compiles_within_the_storage_buffers_the_device_allows():
    """The worker's report carries maxPerStageDescriptorStorageBuffers; a graph compiled before the device
    was known is compiled again for it when it runs. Forced to 4, the shared-intermediate graph (one step
    would bind 5: parameters, x, three outputs) runs as two steps, saying so, bit-identical to its nodes."""
    async def scenario(state: Runtime) -> None:
        device = graphs.device_storage_buffers(state.worker.info)
        assert device == state.worker.info["device"]["max_per_stage_storage_buffers"] >= 4
        graph = graphs.parse(shared_intermediate(np.float32).model_dump(mode="json"), state.settings)
        early = await graphs.compile_graph(state.settings, graph)          # before the device was known
        compiled = await graphs.compile_graph(state.settings, graph, device)
        assert compiled is not early and compiled.storage_buffers == device
        assert compiled.report.dispatches == 2 and compiled.report.fused
        assert any("5 storage buffers, beyond VKACT_GRAPH_MAX_STORAGE_BUFFERS (4)" in n for n in compiled.report.notes)
        x = sample(np.float32)
        expected = await _node_by_node(state.worker, graph, x)
        for given in (compiled, early):
            answer = await graphs.run_graph(state, given, {"x": x.reshape(-1).view(np.uint8)})
            assert {name: bytes(view) for name, view in answer.outputs.items()} == expected
            answer.release()

    _with_state(scenario, graph_max_storage_buffers=4)


@pytest.mark.timeout(180)
def test_graph_models_are_the_server_s_and_compile_once_for_the_device():
    """Two GraphModels on one graph file (two HTTP processes of one server): a load through one is found,
    counted and unloaded through the other, and a reload replaces it in both. A model loaded before the
    device reported (no limits) is compiled again once for the device's, and that plan is kept."""
    async def scenario(state: Runtime) -> None:
        other = GraphModels(state.settings, Metrics().triton, state.graphs._file.path, state.device)
        text = json.dumps(linear_tanh_shrink_dict(np.float32))
        early = await state.graphs.load("lts", text, None)     # as before the device worker reported
        assert early.compiled.storage_buffers is None
        device = graphs.device_storage_buffers(state.worker.info)
        found = await state.graphs.find("lts")
        assert found.compiled.storage_buffers == device and await state.graphs.find("lts") is found   # kept
        theirs = await other.find("lts")
        assert other.names() == ["lts"] and theirs.compiled.storage_buffers == device and await other.find("lts") is theirs
        with pytest.raises(InvalidRequest) as err:   # the limit counts the server's models
            await other.load("one_more", text, state.device())
        assert "VKACT_MAX_GRAPH_MODELS=1" in err.value.message
        await other.load("lts", json.dumps(linear_tanh_shrink_dict(np.float16)), state.device())   # a reload takes no room
        assert (await state.graphs.find("lts")).inputs[0].datatype == "FP16"
        reloaded = linear_tanh_shrink_dict(np.float32, alpha=0.6)
        await state.graphs.load("lts", json.dumps(reloaded), state.device())
        x = sample(np.float32)
        expected = await _node_by_node(state.worker, graphs.parse(reloaded, state.settings), x)
        assert (await other.find("lts")).graph == graphs.parse(reloaded, state.settings)
        answer = await graphs.run_graph(state, (await other.find("lts")).compiled, {"x": x.reshape(-1).view(np.uint8)})
        assert {name: bytes(view) for name, view in answer.outputs.items()} == expected
        answer.release()
        await state.graphs.unload("lts")
        assert other.names() == [] and not other.has("lts") and state.metrics.triton.model("lts") is None
        with pytest.raises(UnknownOperator):
            await other.find("lts")
        with pytest.raises(UnknownOperator):
            await other.unload("lts")
        state.graphs.close()

    _with_state(scenario, max_graph_models=1)
