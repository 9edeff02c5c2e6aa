"""The model repository as /v2 and gRPC both serve it: the operator models (built in, dataplane.models)
and the graph models (loaded, dataplane.graph_models), one answer per question whichever protocol
asks: the index, load, unload, and a model's metadata, configuration and readiness.

Load, as Triton's: ``parameters.config`` is a JSON text. For an operator model it is Triton's model
configuration (its batching, model_config.load); for any other name it is a DML_GRAPH_DESC, loaded
(or reloaded) as a graph model of that name. A load without a config restores an operator model's
batching and leaves a loaded graph as it is (Triton reloads a model from its repository: a graph's
repository is the config it was loaded with)."""
from __future__ import annotations

from typing import Any

from ..dataplane import NOT_READY, is_ready
from ..dataplane.graph_models import GraphModel, is_graph_config
from ..dataplane.metrics import MODEL_VERSION
from ..dataplane.models import MODELS, find_model
from ..errors import InvalidRequest, PayloadTooLarge, UnknownOperator
from ..limits import GRAPH_CONFIG_BYTES
from .model_config import load as load_batching, model_config, model_metadata, refuse_load_parameters
from .runtime import Runtime


def index(state: Runtime, only_ready: bool) -> list[dict[str, str]]:
    """$repository_index_response: every operator model, then the loaded graph models, with their state."""
    ready = is_ready(state.worker)
    if only_ready and not ready:
        return []
    status, reason = ("READY", "") if ready else ("UNAVAILABLE", NOT_READY)
    return [{"name": name, "version": MODEL_VERSION, "state": status, "reason": reason} for name in (*MODELS, *state.graphs.names())]


async def load(state: Runtime, name: str, params: dict[str, Any]) -> None:
    """A load's parameters (``config``, a string; nothing else), applied to model ``name``."""
    params = dict(params)
    config = params.pop("config", None)
    if config is not None and not isinstance(config, str):
        raise InvalidRequest("the config parameter must be a string (a graph's JSON, or Triton's JSON model configuration)", "config")
    if config is not None and len(config) > GRAPH_CONFIG_BYTES:
        raise PayloadTooLarge(f"the config is {len(config)} characters; at most {GRAPH_CONFIG_BYTES} are taken", "config")
    refuse_load_parameters(params)
    op = MODELS.get(name)
    if op is not None:
        if config is not None and is_graph_config(config):
            raise InvalidRequest(f"{name!r} is an operator model, built in: a graph model needs a name of its own", "name")
        await load_batching(state, op, config)
    elif config is not None:
        await state.graphs.load(name, config, state.device())
    elif not state.graphs.has(name):
        raise UnknownOperator(f"unknown model {name!r}: to load a graph model, give its DML_GRAPH_DESC as the config parameter (a JSON string)")


async def unload(state: Runtime, name: str) -> None:
    if name in MODELS:
        raise InvalidRequest(f"model {name!r} is built into vkact and cannot be unloaded")
    await state.graphs.unload(name)


async def graph_model(state: Runtime, name: str, version: str | None = None) -> GraphModel | None:
    """The graph model ``name`` (its version checked), or None when ``name`` is an operator model's."""
    return None if name in MODELS else await state.graphs.find(name, version)


async def metadata(state: Runtime, name: str, version: str | None = None) -> dict[str, Any]:
    graph = await graph_model(state, name, version)
    return graph.metadata() if graph is not None else model_metadata(state, find_model(name, version))


async def config(state: Runtime, name: str, version: str | None = None) -> dict[str, Any]:
    graph = await graph_model(state, name, version)
    return graph.config() if graph is not None else model_config(state, find_model(name, version))


def ready(state: Runtime, name: str, version: str | None = None) -> bool:
    """Whether model ``name`` takes inferences now; UnknownOperator when there is no such model or version."""
    known(state, name, version)
    return is_ready(state.worker)


def known(state: Runtime, name: str, version: str | None = None) -> str:
    """``name``, once it is known as a model (and ``version`` as its version); else UnknownOperator (404)."""
    if name in MODELS:
        find_model(name, version)
    else:
        state.graphs.check(name, version)
    return name
