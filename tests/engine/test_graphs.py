"""DML graphs on the real device: the compiled plan (fused elementwise groups, softmax-family nodes as
their own dispatches) gives answers bit-identical to the graph's nodes run one by one through
``Engine.execute`` (the oracle), FLOAT16 included; the float64 references chained node by node are a
sanity check. Pipelines are reused when only scalars change. Both memory modes (the engine fixture)."""
from __future__ import annotations

import numpy as np
import pytest

from client.buffers import to_buffer, view
from service.config import Settings
from service.descriptors.graph import GraphDesc, parse_graph
from service.graph_compiler import GraphCompiler
from service.graph_program import FusedStep, NodeStep, ReductionStep
from tests.graph_helpers import SIZES, activation, broadcast_prelu, chain, linear_tanh_shrink, node_by_node, prelu_softmax, sample, shared_intermediate



@pytest.fixture(scope="module")
def compiler() -> GraphCompiler:
    return GraphCompiler(Settings())


def run_both(engine, compiler, graph: GraphDesc, arrays: list[np.ndarray]):
    buffers = [to_buffer(a, d.Strides, d.total_bytes) for a, d in zip(arrays, (graph.input_desc(i) for i in range(graph.InputCount)))]
    plan = compiler.compile(graph)
    fused = engine.execute_graph(plan, buffers)
    oracle = node_by_node(engine, graph, buffers)
    return plan, fused, oracle


def assert_bits_equal(fused: list[np.ndarray], oracle: list[np.ndarray]) -> None:
    assert len(fused) == len(oracle)
    for j, (a, b) in enumerate(zip(fused, oracle)):
        diff = np.flatnonzero(a != b)
        assert diff.size == 0, f"output {j}: {diff.size} bytes differ, first at byte {diff[0]}"


def chained_reference(graph: GraphDesc, x: np.ndarray) -> np.ndarray:
    for op in graph.operators:
        x = op.reference(x)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_linear_scaled_tanh_shrink_is_one_dispatch_bit_identical(engine, compiler, dtype):
    graph = linear_tanh_shrink(dtype)
    x = sample(dtype)
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    assert plan.fused and plan.dispatches == 1 and isinstance(plan.program.steps[0], FusedStep)
    assert_bits_equal(fused, oracle)
    y = view(fused[0], dtype, SIZES, None)
    ref = chained_reference(graph, x)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_allclose(y[finite].astype(np.float64), ref[finite].astype(np.float64), rtol=0, atol=4 * float(np.finfo(dtype).eps) * 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_parameterized_relu_then_softmax1(engine, compiler, dtype):
    sizes = (2, 3, 64)
    graph = parse_graph(prelu_softmax(dtype, sizes, axes=(1, 2)))
    x = sample(dtype, sizes)
    x.reshape(-1)[:8] = np.linspace(-2, 2, 8)   # softmax: NaN/inf would make whole rows NaN
    slope = (np.random.default_rng(1).random(sizes) * 0.5).astype(dtype)
    plan, fused, oracle = run_both(engine, compiler, graph, [x, slope])
    step = plan.program.steps[0]   # PARAMETERIZED_RELU in SOFTMAX1's loads, its two inputs read there
    assert plan.dispatches == 1 and isinstance(step, ReductionStep) and step.prologue == (0,) and len(step.reads) == 2
    assert_bits_equal(fused, oracle)
    y = view(fused[0], dtype, sizes, None)
    ref = graph.operators[1].reference(graph.operators[0].reference(x, slope))
    np.testing.assert_allclose(y.astype(np.float64), ref.astype(np.float64), rtol=8 * float(np.finfo(dtype).eps), atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_two_outputs_and_a_shared_intermediate(engine, compiler, dtype):
    graph = shared_intermediate(dtype)
    assert graph.output_names() == ("s", "p", "l")
    x = sample(dtype)
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    step = plan.program.steps[0]
    assert plan.dispatches == 1 and isinstance(step, FusedStep) and len(step.writes) == 3 and len(step.reads) == 1
    assert_bits_equal(fused, oracle)


def test_a_new_alpha_reuses_the_pipelines(engine, compiler):
    """LINEAR -> SOFTMAX1 -> SHRINK: fused steps and a node step; a second Alpha and Threshold compile
    to the same program and run on the same pipelines, with the new scalars' answer."""
    dtype, sizes = np.float32, (4, 300)

    def graph(alpha: float, threshold: float) -> GraphDesc:
        return parse_graph(chain([
            activation("LINEAR", dtype, sizes, Alpha=alpha, Beta=0.25),
            activation("SOFTMAX1", dtype, sizes, Axes=[1]),
            activation("SHRINK", dtype, sizes, Bias=0.001, Threshold=threshold),
        ]))

    x = sample(dtype, sizes)
    x.reshape(-1)[:8] = 0.5
    first, fused1, oracle1 = run_both(engine, compiler, graph(1.5, 0.002), [x])
    step = first.program.steps[0]   # LINEAR in SOFTMAX1's loads, SHRINK in its stores
    assert first.dispatches == 1 and isinstance(step, ReductionStep) and (step.prologue, step.epilogue) == ((0,), (2,))
    assert_bits_equal(fused1, oracle1)
    created, glslang_runs = engine.stats.pipelines_created, compiler.compiled
    second = compiler.compile(graph(-3.0, 0.004))
    assert second.program is first.program
    fused2 = engine.execute_graph(second, [x.tobytes()])
    assert engine.stats.pipelines_created == created and compiler.compiled == glslang_runs
    assert not np.array_equal(fused1[0], fused2[0])
    assert_bits_equal(fused2, node_by_node(engine, second.graph, [x.tobytes()]))


def test_strided_and_broadcast_nodes_run_unfused_and_say_so(engine, compiler):
    """A broadcast SlopeTensor has no packed layout: that node runs with its own kernel; the answer is
    still the node-by-node one, and the plan notes why."""
    dtype, sizes = np.float32, (6, 40)
    graph = parse_graph(broadcast_prelu(dtype, sizes))
    x = sample(dtype, sizes)
    slope = np.linspace(0.1, 0.9, sizes[1], dtype=dtype)
    plan = compiler.compile(graph)
    assert not plan.fused and "Nodes[1]" in plan.notes[0] and plan.dispatches == 3
    inputs = [x.tobytes(), slope.tobytes()]
    assert_bits_equal(engine.execute_graph(plan, inputs), node_by_node(engine, graph, inputs))


def test_node_by_node_plan_gives_the_fused_answer(engine, compiler):
    graph = linear_tanh_shrink(np.float16, alpha=-2.5)
    x = to_buffer(sample(np.float16, seed=3), None, graph.input_desc(0).total_bytes)
    unfused = compiler.compile(graph, fuse=False)
    assert unfused.dispatches == 3 and all(isinstance(s, NodeStep) for s in unfused.program.steps)
    assert_bits_equal(engine.execute_graph(unfused, [x]), engine.execute_graph(compiler.compile(graph), [x]))


def test_a_shader_beyond_the_size_limit_runs_node_by_node(engine):
    small = GraphCompiler(Settings(max_fused_shader_bytes=4096))
    graph = linear_tanh_shrink(np.float32)
    plan = small.compile(graph)
    assert not plan.fused and "max_fused_shader_bytes" in plan.notes[0] and plan.dispatches == 3
    x = sample(np.float32).tobytes()
    assert_bits_equal(engine.execute_graph(plan, [x]), node_by_node(engine, graph, [x]))


def test_wrong_input_size_is_refused(engine, compiler):
    from service.errors import InvalidRequest

    plan = compiler.compile(linear_tanh_shrink(np.float32))
    with pytest.raises(InvalidRequest) as err:
        engine.execute_graph(plan, [b"\0" * 8])
    assert err.value.field == "x"


def test_generated_shaders_fall_back_to_a_temp_dir(tmp_path, monkeypatch):
    """A read-only image: neither the setting's directory nor the SPIR-V cache can be written, so the
    generated shaders go under the system's temp dir (TMPDIR, writable in the restricted pod)."""
    from service.graph_compiler import generated_cache_dir

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    settings = Settings(generated_shader_cache=blocked / "gen", spirv_cache=blocked / "spirv")
    where = generated_cache_dir(settings)
    assert where.parent == tmp_path / "tmp"
    plan = GraphCompiler(settings).compile(linear_tanh_shrink(np.float32))
    assert plan.fused and any(p.suffix == ".spv" for p in where.iterdir())
    assert generated_cache_dir(Settings(generated_shader_cache=tmp_path / "mine")) == tmp_path / "mine"


def test_a_graph_beyond_the_buffer_pool_is_refused(engine, compiler, monkeypatch):
    """Intermediates are sized by their declared descriptors, not by the data sent: a graph whose
    buffers together exceed VKACT_POOL_BYTES is a 413 before anything is allocated."""
    from service.errors import PayloadTooLarge

    sizes = (7, 1000)   # a structure no other test runs: no program of it is kept yet
    graph = parse_graph(chain([activation("RELU", np.float32, sizes), activation("TANH", np.float32, sizes)]))
    monkeypatch.setattr(engine, "settings", engine.settings.model_copy(update={"pool_bytes": 1 << 14}))
    with pytest.raises(PayloadTooLarge) as err:
        engine.execute_graph(compiler.compile(graph), [sample(np.float32, sizes).tobytes()])
    assert err.value.field == "Graph" and "VKACT_POOL_BYTES" in err.value.message


def test_empty_tensors_give_empty_outputs(engine, compiler):
    """vkact allows size-0 dimensions (as ONNX does): nothing is dispatched, the outputs are empty."""
    graph = parse_graph(chain([activation("RELU", np.float32, (0, 4)), activation("SOFTMAX1", np.float32, (0, 4))]))
    plan = compiler.compile(graph)
    assert plan.fused and not plan.notes
    assert [o.nbytes for o in engine.execute_graph(plan, [b""])] == [0]


@pytest.mark.parametrize("axes", [[1], [0]], ids=["rows", "columns"])   # columns: the strided row layout
@pytest.mark.parametrize("kind", ["SOFTMAX1", "LOG_SOFTMAX1", "HARDMAX1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_elementwise_nodes_after_a_reduction_go_into_its_stores(engine, compiler, dtype, kind, axes):
    """SOFTMAX-family -> LINEAR -> SCALED_TANH: one dispatch, each result rounded to its type before the
    epilogue (where the node-by-node run stores it), bit-identical to the nodes one by one."""
    sizes = (40, 72)
    graph = parse_graph(chain([
        activation(kind, dtype, sizes, Axes=axes),
        activation("LINEAR", dtype, sizes, Alpha=3.0, Beta=-0.7),
        activation("SCALED_TANH", dtype, sizes, Alpha=0.9, Beta=1.1),
    ]))
    x = sample(dtype, sizes, seed=7)
    x.reshape(-1)[:8] = np.linspace(-1, 1, 8)
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    assert plan.dispatches == 1 and isinstance(plan.program.steps[0], ReductionStep)
    assert_bits_equal(fused, oracle)


@pytest.mark.parametrize("axes", [[1], [0]], ids=["rows", "columns"])   # columns: the strided row layout
@pytest.mark.parametrize("kind", ["SOFTMAX1", "LOG_SOFTMAX1", "HARDMAX1"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_elementwise_nodes_before_a_reduction_go_into_its_loads(engine, compiler, dtype, kind, axes):
    """LINEAR -> SCALED_TANH -> SOFTMAX-family -> SHRINK: one dispatch, the prologue recomputed at each
    of the reduction's reads (rows of 75: ragged heads and tails as well as whole units), each value
    rounded to its type where the node-by-node run stores it: bit-identical to the nodes one by one."""
    sizes = (40, 75)
    graph = parse_graph(chain([
        activation("LINEAR", dtype, sizes, Alpha=2.5, Beta=-0.3),
        activation("SCALED_TANH", dtype, sizes, Alpha=1.3, Beta=0.9),
        activation(kind, dtype, sizes, Axes=axes),
        activation("SHRINK", dtype, sizes, Bias=0.001, Threshold=0.002),
    ]))
    x = sample(dtype, sizes, seed=11)
    x.reshape(-1)[:8] = np.linspace(-1, 1, 8)
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    step = plan.program.steps[0]
    assert plan.fused and plan.dispatches == 1 and isinstance(step, ReductionStep)
    assert (step.prologue, step.epilogue, step.reads) == ((0, 1), (3,), (("input", 0),))
    assert_bits_equal(fused, oracle)


def test_a_prologue_needed_elsewhere_stays_a_dispatch_and_says_so(engine, compiler):
    """LINEAR -> SOFTMAX1 where LINEAR's value is also a graph output: it must exist in memory, so
    LINEAR stays a fused dispatch of its own and the notes say why; the answers are the nodes'."""
    dtype, sizes = np.float16, (6, 50)
    graph = parse_graph({
        "InputCount": 1, "OutputCount": 2,
        "Nodes": [{"Operator": activation("LINEAR", dtype, sizes, Alpha=0.7, Beta=0.2)},
                  {"Operator": activation("SOFTMAX1", dtype, sizes, Axes=[1])}],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}],
        "IntermediateEdges": [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0}],
        "OutputEdges": [{"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"},
                        {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "GraphOutputIndex": 1, "Name": "l"}],
    })
    x = sample(dtype, sizes, seed=5)
    x.reshape(-1)[:8] = 0.25
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    assert plan.fused and plan.dispatches == 2 and isinstance(plan.program.steps[0], FusedStep)
    assert "Nodes[0] must exist in memory" in plan.notes[0]
    assert_bits_equal(fused, oracle)


def test_float16_intermediates_round_as_stored_for_every_half(engine, compiler):
    """Every FLOAT16 bit pattern (NaN payloads, infinities, subnormals, zeros) through LINEAR with
    Alpha = 1 + 2^-11, whose products of halves lie exactly halfway between two halves (ties to even),
    overflow past 65504, and cross the subnormal boundary, then two more nodes that read the rounded
    value: the fused chain (rounding in float arithmetic, graph_glsl.ROUNDED) gives the nodes' bits."""
    sizes = (256, 256)
    graph = parse_graph(chain([
        activation("LINEAR", np.float16, sizes, Alpha=1 + 2.0 ** -11, Beta=0.0),
        activation("LINEAR", np.float16, sizes, Alpha=-0.5, Beta=2.0 ** -20),   # 65536 halves to 32768, inf stays inf
        activation("SHRINK", np.float16, sizes, Bias=2.0 ** -24, Threshold=0.0),
    ]))
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(sizes)
    plan, fused, oracle = run_both(engine, compiler, graph, [x])
    assert plan.dispatches == 1 and isinstance(plan.program.steps[0], FusedStep)
    assert_bits_equal(fused, oracle)


def _prelu_chain(dtype, sizes=SIZES) -> dict:
    """x -> PARAMETERIZED_RELU(., s1) -> PARAMETERIZED_RELU(., s2) -> PARAMETERIZED_RELU(., s3) -> y: one
    fused group that reads 4 tensors (6 storage buffers with its parameters and output)."""
    prelu = activation("PARAMETERIZED_RELU", dtype, sizes, ("InputTensor", "SlopeTensor"))
    return {
        "InputCount": 4, "OutputCount": 1,
        "Nodes": [{"Operator": prelu}] * 3,
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}]
        + [{"GraphInputIndex": n + 1, "ToNodeIndex": n, "ToNodeInputIndex": 1, "Name": f"s{n + 1}"} for n in range(3)],
        "IntermediateEdges": [{"FromNodeIndex": n, "FromNodeOutputIndex": 0, "ToNodeIndex": n + 1, "ToNodeInputIndex": 0} for n in range(2)],
        "OutputEdges": [{"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"}],
    }


def _bindings(step: FusedStep) -> int:
    """Storage buffers engine_graph binds for a fused step: its parameters, each read, each write."""
    return 1 + len(step.reads) + len(step.writes)


@pytest.mark.parametrize("limit,steps", [(4, 3), (5, 2)])
def test_a_fused_group_beyond_the_storage_buffer_limit_runs_as_smaller_groups(engine, compiler, limit, steps):
    graph = parse_graph(_prelu_chain(np.float32))
    arrays = [sample(np.float32, seed=i) for i in range(4)]
    whole = compiler.compile(graph)
    assert whole.dispatches == 1 and _bindings(whole.program.steps[0]) == 6   # the graph would exceed it
    limited = GraphCompiler(Settings(graph_max_storage_buffers=limit))
    plan, fused, oracle = run_both(engine, limited, graph, arrays)
    assert plan.dispatches == steps and all(isinstance(s, FusedStep) and _bindings(s) <= limit for s in plan.program.steps)
    assert plan.fused and any(f"VKACT_GRAPH_MAX_STORAGE_BUFFERS ({limit})" in n and "6 storage buffers" in n for n in plan.notes)
    assert_bits_equal(fused, oracle)
    # the device's own limit, handed to compile(), does the same, and the cache keys on it
    device = compiler.compile(graph, storage_buffers=limit)
    assert device.dispatches == steps and f"maxPerStageDescriptorStorageBuffers ({limit})" in device.notes[0]
    assert compiler.compile(graph).dispatches == 1


def test_a_prologue_beyond_the_storage_buffer_limit_stays_a_dispatch_of_its_own(engine, compiler):
    """A strided reduction (columns) with a two-input prologue binds input, output, its table, the
    parameters and the slope: 5. At a limit of 4 the PARAMETERIZED_RELU runs before it, not in its loads."""
    graph = parse_graph(prelu_softmax(np.float32, sizes=(6, 40), axes=(0,)))
    whole = compiler.compile(graph)
    assert whole.dispatches == 1 and isinstance(whole.program.steps[0], ReductionStep)
    arrays = [sample(np.float32, (6, 40), seed=i) for i in range(2)]
    plan, fused, oracle = run_both(engine, GraphCompiler(Settings(graph_max_storage_buffers=4)), graph, arrays)
    first, second = plan.program.steps
    assert isinstance(first, FusedStep) and _bindings(first) == 4 and isinstance(second, NodeStep)
    assert any("not in its loads: it would bind 5 storage buffers, beyond VKACT_GRAPH_MAX_STORAGE_BUFFERS (4)" in n for n in plan.notes)
    assert_bits_equal(fused, oracle)


def test_a_chain_longer_than_one_shader_holds_runs_as_fused_steps(engine, compiler):
    """MAX_FUSED_NODES per generated shader (a driver's pipeline build grows superlinearly with it: see
    graph_compiler): 40 nodes run as two fused steps, bit-identical to their nodes one by one."""
    from service.graph_compiler import MAX_FUSED_NODES

    n = MAX_FUSED_NODES + 8
    graph = parse_graph(chain([activation("LINEAR", np.float32, SIZES, Alpha=1.01, Beta=0.01) if k % 2
                               else activation("SOFTSIGN", np.float32, SIZES) for k in range(n)]))
    plan, fused, oracle = run_both(engine, compiler, graph, [sample(np.float32)])
    steps = plan.program.steps
    assert plan.fused and plan.dispatches == 2 and all(isinstance(s, FusedStep) for s in steps)
    assert [len(s.nodes) for s in steps] == [MAX_FUSED_NODES, 8]
    assert_bits_equal(fused, oracle)
