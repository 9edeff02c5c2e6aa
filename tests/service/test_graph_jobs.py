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
