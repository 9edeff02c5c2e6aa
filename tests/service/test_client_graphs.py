"""The client's graphs (client.graphs) against a real server on lavapipe: a graph built from the operator
methods and compiled once answers bit-identically to the same methods called one by one (each its own
/v1 request), sync and async, in every encoding; misuse is refused before anything is sent."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from client import AsyncClient, Client, CompiledGraph, InvalidDescriptor
from tests.graph_helpers import sample


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _chain(vk, x, dtype):
    """LINEAR -> SCALED_TANH -> SHRINK with the same scalars, on ``vk`` (a client, or a graph builder)."""
    return vk.shrink(vk.scaled_tanh(vk.linear(x, alpha=1.7, beta=-0.3), alpha=1.3, beta=0.9), bias=0.1, threshold=0.4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("encoding", ["binary", "base64", "json"])
def test_a_compiled_chain_is_the_methods_one_by_one(server, dtype, encoding):
    x = sample(dtype)
    with Client(server.url, encoding=encoding) as vk:
        g = vk.graph()
        f = g.compile(y=_chain(g, g.input("x", x.shape, dtype), dtype))
        expected = _chain(vk, x, dtype)     # three /v1 requests
        for _ in range(2):                  # compiled once, called twice
            out = f(x=x)
            assert list(out) == ["y"] and out["y"].dtype == dtype and out["y"].shape == x.shape
            if encoding == "json":          # numbers: exact, a NaN's payload aside
                np.testing.assert_array_equal(out["y"], expected)
            else:
                assert _bits(out["y"]) == _bits(expected)
        assert f.report == {"Fused": True, "Dispatches": 1, "Nodes": 3, "Notes": []}


def test_two_inputs_a_reduction_and_outputs_sharing_an_intermediate(server):
    sizes = (2, 3, 64)
    x = sample(np.float32, sizes)
    x.reshape(-1)[:8] = np.linspace(-2, 2, 8)   # softmax: NaN/inf would make whole rows NaN
    slope = (np.random.default_rng(1).random(sizes) * 0.5).astype(np.float32)
    with Client(server.url) as vk:
        g = vk.graph()
        gx, gs = g.input("x", sizes), g.input("slope", sizes)
        h = g.parameterized_relu(gx, gs)
        unused = g.sigmoid(gx)   # leads to no output: left out of the graph
        f = g.compile(soft=g.softmax1(h, axes=[1, 2]), prelu=h, tanh=g.tanh(h))
        assert unused.index is not None and len(f.desc["Nodes"]) == 3
        out = f(slope=slope, x=x)
        h_ref = vk.parameterized_relu(x, slope)
        expected = {"soft": vk.softmax1(h_ref, axes=[1, 2]), "prelu": h_ref, "tanh": vk.tanh(h_ref)}
        assert list(out) == ["soft", "prelu", "tanh"]
        for name in expected:
            assert _bits(out[name]) == _bits(expected[name]), name


def test_async_graphs_are_the_methods_one_by_one(server):
    x = sample(np.float16)

    async def main() -> None:
        async with AsyncClient(server.url) as vk:
            g = vk.graph()
            f = g.compile(y=_chain(g, g.input("x", x.shape, np.float16), np.float16))
            expected = await vk.shrink(await vk.scaled_tanh(await vk.linear(x, alpha=1.7, beta=-0.3), alpha=1.3, beta=0.9), bias=0.1, threshold=0.4)
            outs = await asyncio.gather(f(x=x), f({"x": x}, encoding="base64"))
            for out in outs:
                assert _bits(out["y"]) == _bits(expected)

    asyncio.run(main())


def test_misuse_is_refused_before_sending_and_the_service_errors_come_through(server):
    with Client(server.url) as vk:
        g = vk.graph()
        x = g.input("x", (4,))
        with pytest.raises(ValueError):
            g.input("x", (4,))
        with pytest.raises(TypeError):
            g.relu(np.ones(4, np.float32))                     # an array, not a graph tensor
        with pytest.raises(TypeError):
            vk.graph().relu(x)                                 # another graph's tensor
        with pytest.raises(TypeError):
            g.relu(x, in_place=True)
        with pytest.raises(ValueError):
            g.compile()
        f: CompiledGraph = g.compile(y=g.relu(x))
        with pytest.raises(TypeError):
            f(z=np.ones(4, np.float32))
        with pytest.raises(TypeError):
            f()
        with pytest.raises(ValueError):
            f(x=np.ones(5, np.float32))
        with pytest.raises(ValueError):
            f(x=np.ones(4, np.float64))
        # what only the service knows: a scalar DirectML refuses, named by its field
        bad = vk.graph()
        bad_f = bad.compile(y=bad.celu(bad.input("x", (4,)), alpha=0.0))
        with pytest.raises(InvalidDescriptor) as err:
            bad_f(x=np.ones(4, np.float32))
        assert err.value.field.startswith("Graph.Nodes[0].Operator")
        assert err.value.status == 422
        np.testing.assert_array_equal(f(x=np.array([-1, 0, 1, 2], np.float32))["y"], [0, 0, 1, 2])
