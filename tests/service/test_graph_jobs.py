"""Graphs through a real device worker process (``DeviceWorker.run_graph``): the plan compiled on the
HTTP side crosses as bytes, the worker runs it on the slot's inputs and writes each output into the
slot; answers bit-identical to the graph's nodes run one by one as ordinary jobs; a graph's error is
the request's, and the worker stays up."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.config import Settings
from service.errors import UnsupportedOnDevice
from service.graph_compiler import GraphCompiler
from service.worker import DeviceWorker
from tests.graph_helpers import SIZES, sample, shared_intermediate


async def _node_by_node(worker: DeviceWorker, graph, x: np.ndarray) -> dict[int, bytes]:
    values: dict[int, bytes] = {}
    ops = graph.operators
    for n in graph.order:
        sources = {e.ToNodeInputIndex: e.FromNodeIndex for e in graph.IntermediateEdges if e.ToNodeIndex == n}
        args = [np.frombuffer(values[sources[i]], np.uint8) if i in sources else x.reshape(-1).view(np.uint8) for i in range(len(ops[n].input_fields))]
        result = await worker.run(ops[n], args, False)
        values[n] = bytes(result.output)
        result.release()
    return values


@pytest.mark.timeout(120)
def test_a_graph_job_gives_the_node_by_node_answer():
    graph = shared_intermediate(np.float32)
    plan = GraphCompiler(Settings()).compile(graph)
    x = sample(np.float32)

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            for _ in range(2):   # the second time, the worker knows the plan's bytes
                result = await worker.run_graph(plan, [x.reshape(-1).view(np.uint8)])
                outputs = [bytes(view) for view in result.outputs]
                result.release()
                values = await _node_by_node(worker, graph, x)
                ordered = sorted(graph.OutputEdges, key=lambda e: e.GraphOutputIndex)
                assert outputs == [values[e.FromNodeIndex] for e in ordered]
            # a tensor beyond the device's binding limit: the request's error, named by the node
            import pickle
            plan_bytes = pickle.dumps(plan)
            huge = GraphCompiler(Settings()).compile(_huge_graph())
            with pytest.raises(UnsupportedOnDevice) as err:
                await worker.run_graph(huge, [np.zeros(1, np.uint8)], key=None)
            assert err.value.field.startswith("Graph.Nodes[0]")
            again = await worker.run_graph(plan, [x.reshape(-1).view(np.uint8)], key=plan_bytes)
            assert [bytes(v) for v in again.outputs] == outputs
            again.release()
        finally:
            await worker.close()

    asyncio.run(scenario())


def _huge_graph():
    """One RELU whose tensors claim more bytes than any device binds (TotalTensorSizeInBytes 2^40):
    valid for DirectML, refused by the worker before any device work."""
    from service.descriptors.graph import parse_graph
    from tests.graph_helpers import activation, chain

    relu = activation("RELU", np.float32, SIZES)
    relu["OutputTensor"] = dict(relu["InputTensor"])
    relu["InputTensor"]["TotalTensorSizeInBytes"] = 1 << 40
    return parse_graph(chain([relu]))


def _softmax_chain(nodes: int, sizes: tuple[int, ...]):
    """``nodes`` SOFTMAX1 one after the other: a dispatch each, so a pipeline each to build (on lavapipe
    about 0.1 s apiece, the driver compiling the shader)."""
    from service.descriptors.graph import parse_graph
    from tests.graph_helpers import activation, chain

    return parse_graph(chain([activation("SOFTMAX1", np.float32, sizes, Axes=[len(sizes) - 1]) for _ in range(nodes)]))


@pytest.mark.timeout(300)
def test_other_jobs_are_answered_while_a_new_graphs_pipelines_build():
    """A graph of a structure the worker has not run parks while its pipelines build beside the job
    thread: jobs sent after it are answered before it (they waited for the whole build before: about
    3 s for 32 softmax pipelines here, against well under 1 ms a RELU job), the graphs parked on one
    program and the other's are answered the node-by-node answer once built, and every place in the
    worker's window comes back."""
    from service.limits import IN_FLIGHT
    from service.operators import parse_operator
    from tests.helpers import tensor

    relu = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_RELU", "InputTensor": tensor(np.float32, (1024,)), "OutputTensor": tensor(np.float32, (1024,))})
    x = np.linspace(-2, 2, 1024, dtype=np.float32)
    graphs = [_softmax_chain(32, (4, 129)), _softmax_chain(8, (4, 131))]
    plans = [GraphCompiler(Settings()).compile(g) for g in graphs]
    inputs = [sample(np.float32, (4, 129), seed=1), sample(np.float32, (4, 131), seed=2)]

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))
        worker.start()
        await worker.wait_ready(60)
        try:
            warm = await worker.run(relu, [x.view(np.uint8)], False)  # its pipeline built: a job like any other
            warm.release()
            # two programs, the first sent twice: three parked jobs, two builds one after the other
            pending = [asyncio.ensure_future(worker.run_graph(plan, [v.reshape(-1).view(np.uint8)]))
                       for plan, v in ((plans[0], inputs[0]), (plans[0], inputs[0]), (plans[1], inputs[1]))]
            answered_during_build = 0
            for _ in range(10):
                result = await worker.run(relu, [x.view(np.uint8)], False)
                assert np.array_equal(np.frombuffer(result.output, np.float32), np.maximum(x, 0))
                result.release()
                answered_during_build += not pending[0].done()
            assert answered_during_build == 10  # each one before the first graph's build ended
            results = await asyncio.gather(*pending)
            for result, graph, v in zip(results, (graphs[0], graphs[0], graphs[1]), (inputs[0], inputs[0], inputs[1])):
                outputs = [bytes(view) for view in result.outputs]
                result.release()
                values = await _node_by_node(worker, graph, v)
                assert outputs == [values[graph.OutputEdges[0].FromNodeIndex]]
            assert worker._window.free == IN_FLIGHT and not worker._inflight and worker._inflight_batches == 0
            assert not worker._queue and worker._resent_ahead == 0
            again = await worker.run_graph(plans[1], [inputs[1].reshape(-1).view(np.uint8)])  # built: runs at once
            again.release()
        finally:
            await worker.close()

    asyncio.run(scenario())


@pytest.mark.timeout(120)
def test_a_graph_whose_build_fails_is_told_and_the_worker_serves_on():
    """A build refused on the build thread (the graph's tensors past the pool: PayloadTooLarge) is the
    parked request's error, and the worker goes on serving, graphs included."""
    from service.errors import PayloadTooLarge

    big = GraphCompiler(Settings()).compile(_softmax_chain(2, (64, 4096)))  # 1 MiB tensors: past a 1 MiB pool
    small = GraphCompiler(Settings()).compile(shared_intermediate(np.float32))
    x = sample(np.float32)

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off", pool_bytes=1 << 20))
        worker.start()
        await worker.wait_ready(60)
        try:
            with pytest.raises(PayloadTooLarge) as err:
                await worker.run_graph(big, [np.zeros(64 * 4096, np.float32).view(np.uint8)])
            assert err.value.field == "Graph"
            result = await worker.run_graph(small, [x.reshape(-1).view(np.uint8)])
            assert len(result.outputs) == 3
            result.release()
        finally:
            await worker.close()

    asyncio.run(scenario())
