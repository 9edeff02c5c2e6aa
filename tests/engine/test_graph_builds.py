"""Graph programs built on a thread beside the engine's own (service/graph_builds.py, as the device worker
builds them): one build per program however many jobs wait for it, in the order asked, the run taken into
the engine on its thread giving the node-by-node answer; a build stopped between pipelines leaves the
engine as it was. Both memory modes (the engine fixture)."""
from __future__ import annotations

import itertools
import select

import numpy as np
import pytest

from service.config import Settings
from service.descriptors.graph import parse_graph
from service.engine_graph import BuildCancelled, GraphRun
from service.graph_builds import GraphBuilds
from service.graph_compiler import GraphCompiler
from tests.graph_helpers import activation, chain, node_by_node, sample

_shapes = itertools.count(211)  # a shape per test and memory mode: programs the session's engine has not run


def softmax_chain(nodes: int):
    sizes = (3, next(_shapes))
    graph = parse_graph(chain([activation("SOFTMAX1", np.float32, sizes, Axes=[1]) for _ in range(nodes)]))
    return graph, GraphCompiler(Settings()).compile(graph), sizes


def wait_for(builds: GraphBuilds, count: int) -> list:
    ended = []
    while len(ended) < count:
        select.select([builds.fileno()], [], [], 60)
        ended += builds.finished()
    return ended


@pytest.mark.timeout(120)
def test_jobs_of_one_program_wait_for_one_build_and_the_run_is_the_engines(engine):
    (g1, p1, s1), (g2, p2, s2) = softmax_chain(3), softmax_chain(2)
    created = engine.stats.pipelines_created
    builds = GraphBuilds(engine)
    try:
        builds.park(p1, "a")
        builds.park(p1, "b")  # the same program: no second build
        builds.park(p2, "c")
        assert builds.pending()
        ended = wait_for(builds, 2)
        assert [(plan, jobs) for plan, _, jobs in ended] == [(p1, ["a", "b"]), (p2, ["c"])]
        assert not builds.pending() and not builds.ended()
        for plan, run, _ in ended:
            assert isinstance(run, GraphRun) and not engine.has_graph_run(plan)
            assert engine.prepare_graph(plan, run) is run and engine.has_graph_run(plan)
        assert engine.stats.pipelines_created - created == 3 + 2  # a pipeline a softmax node, built once
        for (plan, _, _), graph, sizes in zip(ended, (g1, g2), (s1, s2)):
            x = sample(np.float32, sizes).tobytes()
            [got] = engine.execute_graph(plan, [x])
            [want] = node_by_node(engine, graph, [x])
            assert np.array_equal(got, want)
    finally:
        assert builds.close() == []


@pytest.mark.timeout(120)
def test_a_build_stopped_between_pipelines_leaves_the_engine_as_it_was(engine):
    graph, plan, sizes = softmax_chain(4)
    asked = itertools.count()
    with pytest.raises(BuildCancelled):
        GraphRun(engine, plan, cancelled=lambda: next(asked) >= 2)  # two pipelines built, then stopped
    assert next(asked) == 3 and not engine.has_graph_run(plan)
    x = sample(np.float32, sizes).tobytes()
    [got] = engine.execute_graph(plan, [x])  # built again, whole, on the engine's thread
    assert np.array_equal(got, node_by_node(engine, graph, [x])[0])
    builds = GraphBuilds(engine)
    builds.park(softmax_chain(8)[1], "waiting")
    assert builds.close() == ["waiting"]  # not begun, stopped at a pipeline or built: unanswered either way


@pytest.mark.timeout(120)
def test_graph_runs_keep_their_pipelines_within_the_budget(engine, monkeypatch):
    """Runs go, least recently used first, so that all runs' pipelines stay within MAX_GRAPH_PIPELINES (on
    lavapipe each holds about 8 MB of the worker's memory), besides their count bound."""
    import service.engine_graph as engine_graph

    monkeypatch.setattr(engine_graph, "MAX_GRAPH_PIPELINES", 5)
    engine.graph_runs.clear()  # a clean start: the session's other runs go (the bound counts them all)
    plans = [softmax_chain(2)[1] for _ in range(3)]  # 2 pipelines each: the third takes the first's place
    for plan in plans:
        engine.prepare_graph(plan)
        assert engine.graph_runs.pipelines <= 5
    assert [engine.has_graph_run(p) for p in plans] == [False, True, True]
