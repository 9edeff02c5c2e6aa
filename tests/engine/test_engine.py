"""Engine behaviour beyond the maths: reuse, memory types, eviction, limits and contracts."""
from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from client.buffers import to_buffer
from service.config import Settings
from service.buckets import bucket
from service.engine import Engine
from service.errors import DescriptorError, InvalidRequest, UnsupportedOnDevice
from tests.helpers import any_op, assert_matches, make_op, run, view

WORKLOAD = [  # (kind, dtype, sizes, input strides, in place)
    ("SHRINK", np.float32, (1000,), None, False),
    ("CELU", np.float16, (7, 9), None, False),
    ("SOFTSIGN", np.float32, (3, 4, 5), (0, 5, 1), False),
    ("SCALED_TANH", np.float16, (40, 30), (1, 40), True),
    ("SHRINK", np.float32, (1 << 18,), None, False),
]


def run_workload(engine: Engine, scale: int = 0, keyed: bool = False, seed: int | None = None) -> None:
    rng = np.random.default_rng(scale if seed is None else seed)
    for kind, dtype, sizes, strides, in_place in WORKLOAD:
        sizes = (sizes[0] - scale,) + sizes[1:]
        x = rng.standard_normal(sizes).astype(dtype)
        if strides and 0 in strides:
            x = np.broadcast_to(x[:1], sizes).copy()
        op = make_op(kind, dtype, sizes, strides)
        assert_matches(run(engine, op, x, in_place=in_place, keyed=keyed), op.reference(x), 4 if dtype is np.float32 else 1)


def test_warm_calls_create_no_pipeline_and_allocate_no_buffer(engine):
    run_workload(engine)
    warm = (engine.stats.pipelines_created, engine.stats.buffers_allocated)
    dispatches = engine.stats.dispatches
    for _ in range(3):
        run_workload(engine)
    run_workload(engine, scale=1)  # other sizes in the same capacity buckets reuse them too
    assert (engine.stats.pipelines_created, engine.stats.buffers_allocated) == warm
    assert engine.stats.dispatches == dispatches + 4 * len(WORKLOAD)


def test_keyed_calls_replay_their_recorded_command_buffer_on_new_data(memory):
    """The worker's path: a plan and command buffer per descriptor, recorded once; every replay reads
    the new input (fresh random data each round), and nothing is created after the first round."""
    engine = Engine(Settings(memory=memory))
    try:
        run_workload(engine, keyed=True)
        warm = (engine.stats.pipelines_created, engine.stats.buffers_allocated, len(engine._plans))
        for seed in range(1, 4):
            run_workload(engine, keyed=True, seed=seed)
        assert (engine.stats.pipelines_created, engine.stats.buffers_allocated, len(engine._plans)) == warm
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["packed", "strided", "in place"])
def test_a_replayer_repeats_an_execution_on_the_bytes_now_in_its_buffers(engine, kind):
    """The device worker's repeated request: new bytes in the same input and output buffers, each
    replay computing from them (strided: gaps in the output zeroed, never stale)."""
    if kind == "strided":
        op = make_op("CELU", np.float32, (3, 5), out_strides=(10, 2))  # gaps between output elements
    else:
        op = make_op("CELU", np.float32, (3, 5))
    in_place = kind == "in place"
    key = pickle.dumps((op, kind))
    source = np.zeros(op.inputs[0].total_bytes, np.uint8)
    out = source if in_place else np.full(op.output.total_bytes, 0xAB, np.uint8)
    engine.execute(op, [source], out=out, key=key, in_place=in_place)
    replay = engine.replayer(op, [source], out, key, in_place)
    dispatches = engine.stats.dispatches
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(15).astype(np.float32)
        source[:] = x.view(np.uint8)
        if not in_place:
            out[:] = 0xAB  # whatever the last reader left
        assert replay() > 0
        got = view(out, np.float32, op.output.Sizes, op.output.strides)
        assert_matches(np.array(got), op.reference(x.reshape(3, 5)), 2)
        if kind == "strided":  # every byte besides the elements is zero
            mask = np.zeros(out.nbytes // 4, bool)
            mask[[10 * i + 2 * j for i in range(3) for j in range(5)]] = True
            assert not out.view(np.float32)[~mask].any()
    assert engine.stats.dispatches == dispatches + 3


def test_a_replayer_goes_stale_when_its_plan_is_dropped(memory):
    engine = Engine(Settings(pool_bytes=1 << 20, memory=memory))
    try:
        op = make_op("SOFTSIGN", np.float32, (50_000,))
        x = np.linspace(-4, 4, 50_000, dtype=np.float32).view(np.uint8)
        out = np.zeros(op.output.total_bytes, np.uint8)
        key = pickle.dumps(op)
        engine.execute(op, [x], out=out, key=key)
        replay = engine.replayer(op, [x], out, key)
        assert replay() is not None
        big = make_op("SOFTSIGN", np.float32, (100_000,))  # its slot evicts the first one's
        engine.execute(big, [np.zeros(big.inputs[0].total_bytes, np.uint8)], key=pickle.dumps(big))
        assert engine.stats.slots_evicted > 0
        dispatches = engine.stats.dispatches
        assert replay() is None and engine.stats.dispatches == dispatches  # nothing ran
        with pytest.raises(InvalidRequest):  # no plan: execute first
            engine.replayer(op, [x], out, key)
    finally:
        engine.close()


@pytest.mark.parametrize("nbytes", [1, 4096, 4097, 5000, 65536, 65537, (1 << 26) + 12])
def test_buckets_waste_at_most_a_quarter(nbytes):
    cap = bucket(nbytes)
    assert cap >= nbytes and cap % 16 == 0
    assert cap == 4096 or cap <= nbytes * 1.25


def test_the_memory_mode_asked_for_is_the_one_used(engine, memory):
    """Host memory, or the staging + device-local path of discrete GPUs (exercised on any device)."""
    assert engine.memory == memory
    run_workload(engine)


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_eviction_keeps_the_pool_within_budget_and_results_right(keyed, memory):
    """Keyed: an evicted slot takes the cached plans (and command buffers) that used it along."""
    engine = Engine(Settings(pool_bytes=1 << 20, memory=memory))
    try:
        for n in (50_000, 10_000, 70_000, 20_000, 50_000, 10_000):
            x = np.linspace(-4, 4, n, dtype=np.float32)
            op = make_op("SOFTSIGN", np.float32, (n,))
            assert_matches(run(engine, op, x, keyed=keyed), op.reference(x), 2)
            assert all(plan.prepared.slot.capacity in engine.pool.slots for plan in engine._plans.values())
        assert engine.stats.slots_evicted > 0
        assert engine.pool.bytes <= 1 << 20
    finally:
        engine.close()


def test_output_bytes_without_elements_are_zero_and_never_stale(engine):
    """A larger TotalTensorSizeInBytes and strided gaps must not show an earlier request's data."""
    ones = np.ones(4096, np.float32)
    engine.execute(make_op("SOFTSIGN", np.float32, (4096,)), [to_buffer(ones)])
    x = np.full((2, 3), 3.0, np.float32)
    op = make_op("SOFTSIGN", np.float32, (2, 3), None, (4, 1))            # one padding element per row
    out = engine.execute(op, [to_buffer(x)]).view(np.float32)
    np.testing.assert_array_equal(out, [0.75, 0.75, 0.75, 0, 0.75, 0.75, 0.75])
    bigger = make_op("SOFTSIGN", np.float32, (3,))
    bigger = bigger.model_copy(update={"OutputTensor": bigger.output.like(TotalTensorSizeInBytes=64)})
    out = engine.execute(bigger, [to_buffer(np.full(3, 1.0, np.float32))]).view(np.float32)
    np.testing.assert_array_equal(out, [0.5] * 3 + [0] * 13)


def test_in_place_keeps_the_input_padding(engine):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    op = make_op("SHRINK", np.float32, (2, 3), (4, 1), Threshold=0.0)
    buf = to_buffer(x, (4, 1))
    buf.view(np.float32)[3] = 42.0                                      # the padding element
    out = engine.execute(op, [buf], in_place=True).view(np.float32)
    np.testing.assert_array_equal(out, [0, 1, 2, 42, 3, 4, 5])


def test_data_length_must_match_the_descriptor(engine):
    op = make_op("CELU", np.float32, (4,))
    with pytest.raises(InvalidRequest) as info:
        engine.execute(op, [np.zeros(12, np.uint8)])
    assert info.value.field == "InputTensor" and "16" in info.value.message


def test_in_place_rules(engine):
    broadcast = make_op("CELU", np.float32, (2, 3), (0, 1))
    with pytest.raises(DescriptorError) as info:
        engine.execute(broadcast, [np.zeros(12, np.uint8)], in_place=True)
    assert info.value.field == "OutputTensor"  # the omitted output is packed, the input is not
    transposed = make_op("CELU", np.float32, (2, 3), None, (1, 2))
    with pytest.raises(DescriptorError):
        engine.execute(transposed, [np.zeros(24, np.uint8)], in_place=True)


def test_tensors_beyond_the_device_limit_are_refused(engine):
    n = engine.max_tensor_bytes // 4 + 1
    op = make_op("SHRINK", np.float32, (n,))
    with pytest.raises(UnsupportedOnDevice) as info:
        engine.execute(op, [np.zeros(op.inputs[0].total_bytes, np.uint8)])
    assert info.value.field == "InputTensor.TotalTensorSizeInBytes"


def test_engine_refuses_other_threads(engine):
    op = make_op("SHRINK", np.float32, (4,))
    x, out, key = np.zeros(16, np.uint8), np.zeros(16, np.uint8), pickle.dumps(("other threads", op))
    engine.execute(op, [x], out=out, key=key)
    replay = engine.replayer(op, [x], out, key)
    errors: list[BaseException] = []

    def call() -> None:
        for attempt in (lambda: engine.execute(op, [x]), replay):
            try:
                attempt()
            except BaseException as exc:  # noqa: BLE001 - the assertion below inspects it
                errors.append(exc)

    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert len(errors) == 2 and all(isinstance(e, RuntimeError) for e in errors)


def test_device_report(engine):
    """What the engine takes from the device's limits, on whatever device the run uses."""
    assert engine.max_workgroup_count == engine._mgr.get_device_properties()["max_work_group_count"][0] >= 65535
    assert engine.max_tensor_bytes == engine.device.max_storage_buffer_range // 16 * 16 - 16  # a vector of slack
    assert engine.tuning.memory == ("device" if engine.device.type == "discrete-gpu" else "host")  # Settings.memory 'auto'


def test_device_report_on_llvmpipe(engine):
    if engine.device.driver_name != "llvmpipe":
        pytest.skip("lavapipe's own limits")
    assert engine.device.type == "cpu"
    assert engine.max_workgroup_count == 65535
    assert engine.device.max_storage_buffer_range == 1 << 27
    # Mesa 22.3's lavapipe reports llvmpipe's PIPE_SHADER_CAP_MAX_SHADER_BUFFERS (LP_MAX_TGSI_SHADER_BUFFERS, 32;
    # src/gallium/drivers/llvmpipe/lp_limits.h, beside the 1 << 27 above): read at VkPhysicalDeviceLimits + 76
    assert engine.device.max_per_stage_storage_buffers == 32


def test_every_device_allows_the_vulkan_minimum_of_storage_buffers(engine):
    assert engine.device.max_per_stage_storage_buffers >= 4   # a misread offset gives 0 or a huge number
    assert engine.device.max_per_stage_storage_buffers < 1 << 24


@pytest.mark.parametrize("kind, dtype, n", [("SHRINK", np.float32, 1000), ("CELU", np.float16, 64), ("SOFTSIGN", np.float32, 3)])
@pytest.mark.parametrize("jobs", [2, 5])
def test_a_batch_gives_each_job_what_it_would_get_alone(engine, kind, dtype, n, jobs):
    """The device worker's dynamic batching: equal descriptors, inputs end to end, one dispatch."""
    op = make_op(kind, dtype, (n,))
    rng = np.random.default_rng(n + jobs)
    xs = [(rng.standard_normal(n) * 3).astype(dtype) for _ in range(jobs)]
    outs = [np.full(op.output.total_bytes, 0xAB, np.uint8) for _ in range(jobs)]
    dispatches = engine.stats.dispatches
    engine.execute_batch(op, [([to_buffer(x)], out) for x, out in zip(xs, outs)], key=pickle.dumps(op))
    assert engine.stats.dispatches == dispatches + 1
    for x, out in zip(xs, outs):
        assert_matches(out.view(dtype), op.reference(x), 4 if dtype is np.float32 else 1)


def test_a_batch_of_a_two_input_operator(engine):
    op = any_op("DML_OPERATOR_ACTIVATION_RELU_GRAD", np.float32, (4, 5))
    rng = np.random.default_rng(7)
    pairs = [(rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)) for _ in range(3)]
    outs = [np.zeros(op.output.total_bytes, np.uint8) for _ in pairs]
    engine.execute_batch(op, [([to_buffer(x), to_buffer(g)], out) for (x, g), out in zip(pairs, outs)], key=pickle.dumps(op))
    for (x, g), out in zip(pairs, outs):
        assert_matches(out.view(np.float32).reshape(4, 5), op.reference(x, g), 0)


@pytest.mark.parametrize("op", [
    make_op("SOFTSIGN", np.float32, (3, 4), (0, 1)),        # broadcasts
    make_op("SOFTSIGN", np.float16, (3,)),                  # padded to 4 bytes
    any_op("DML_OPERATOR_ACTIVATION_SOFTMAX", np.float32, (2, 4)),  # a reduction
], ids=["broadcast", "padded", "reduction"])
def test_descriptors_that_cannot_run_end_to_end_are_refused(engine, op):
    assert not op.concatenable
    buffers = [np.zeros(d.total_bytes, np.uint8) for d in op.inputs]
    with pytest.raises(InvalidRequest):
        engine.execute_batch(op, [(buffers, np.zeros(op.output.total_bytes, np.uint8))] * 2, key=pickle.dumps(op))


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_pipelines_are_capped_least_recently_used_out(keyed):
    """Many distinct descriptors (operators, types, layouts, sizes) keep at most max_pipelines compiled
    pipelines; a dropped pipeline takes its plans along, and every result stays right."""
    engine = Engine(Settings(max_pipelines=8))
    kinds = ["SHRINK", "CELU", "SOFTSIGN", "SCALED_TANH", "ELU", "TANH"]
    try:
        for i in range(60):
            kind, dtype = kinds[i % len(kinds)], (np.float32, np.float16)[i % 2]
            sizes, strides = ((i + 3, 5), (1, i + 3)) if i % 3 == 0 else ((64 * (i + 1),), None)
            x = np.random.default_rng(i).standard_normal(sizes).astype(dtype)
            op = make_op(kind, dtype, sizes, strides)
            assert_matches(run(engine, op, x, keyed=keyed), op.reference(x), 4 if dtype is np.float32 else 1)
            assert len(engine.pool.pipelines) <= 8
            assert all(plan.prepared.algorithm in [a for a, _ in engine.pool.pipelines.values()] for plan in engine._plans.values())
        assert engine.stats.pipelines_destroyed >= engine.stats.pipelines_created - 8 > 0
    finally:
        engine.close()


def test_trim_frees_what_was_not_used_since_the_last_trim(engine):
    big, small = make_op("SOFTSIGN", np.float32, (1 << 18,)), make_op("SOFTSIGN", np.float32, (100,))
    xb, xs = np.ones(1 << 18, np.float32), np.ones(100, np.float32)
    run(engine, big, xb, keyed=True)
    run(engine, small, xs, keyed=True)
    engine.trim()                        # both used since the start: kept
    assert engine.pool.bytes > 1 << 20
    run(engine, small, xs, keyed=True)
    engine.trim()                        # the big one was idle for a whole period: freed
    assert 0 < engine.pool.bytes < 1 << 20 and bucket(1 << 20) not in engine.pool.slots
    assert_matches(run(engine, big, xb, keyed=True), big.reference(xb), 2)  # and made again when needed
    engine.trim()
    engine.trim()
    assert engine.pool.bytes == 0 and not engine.pool.pipelines and not engine._plans


def test_every_eval_of_one_recorded_sequence_waits_for_its_own_dispatch(engine):
    """kp patch 10 keeps one fence per sequence, reset after each wait (kp made and destroyed one per eval:
    0.5 ms on an NVIDIA H100). Each eval must still wait for its own dispatch: a fence left signalled would
    return at once and the read-back would hold the previous input's answer. Under the validation layer
    a fence submitted while signalled is an error too."""
    rng = np.random.default_rng(3)
    op = make_op("SOFTSIGN", np.float32, (1 << 16,))
    for _ in range(40):
        x = rng.standard_normal(1 << 16).astype(np.float32) * np.float32(rng.uniform(0.1, 100))
        assert_matches(run(engine, op, x), op.reference(x), 4)
