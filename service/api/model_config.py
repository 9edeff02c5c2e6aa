"""What a model's Triton configuration says about batching, and load_model with a config: the settings
vkact honours (max_batch_size, dynamic_batching) are applied to the model's batching in the device
worker of every HTTP process of the server (dataplane.batching holds them); any other field that
differs from the served configuration is refused (400 / INVALID_ARGUMENT, naming the field), so a
sweep never measures one thing while believing another.

vkact batches as Triton's dynamic batcher with no queue delay: requests of one elementwise model with
equal shapes and parameters that queued while the device was busy run as one dispatch, up to
max_batch_size (VKACT_MAX_BATCH, the device's default otherwise). Reductions are never batched."""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest
from ..operators import OperatorDesc, short_name
from .runtime import Runtime
from ..dataplane.batching import Batching, batches
from ..dataplane.models import config, kernel_features, metadata

HONOURED = ("max_batch_size", "dynamic_batching")


def batching(state: Runtime, op: type[OperatorDesc]) -> Batching:
    """The model's batching: as loaded with a config (through any process of the server), or the service's."""
    loaded = state.batching.get(op)
    if loaded is not None:
        return loaded
    most = state.worker.max_batch if state.worker is not None else 1
    return Batching(most, True) if batches(op) and most > 1 else Batching(0, False)


def features(state: Runtime) -> frozenset[str] | None:
    """The device features the kernels use (None until the device worker has reported)."""
    return kernel_features(state.worker.info) if state.worker is not None else None


def model_metadata(state: Runtime, op: type[OperatorDesc]) -> dict[str, Any]:
    return metadata(op, batching(state, op).max_batch_size, features(state))


def model_config(state: Runtime, op: type[OperatorDesc]) -> dict[str, Any]:
    chosen = batching(state, op)
    return config(op, chosen.max_batch_size, chosen.dynamic, features(state))


async def load(state: Runtime, op: type[OperatorDesc], text: str | None) -> None:
    """load_model: no config restores the service's batching (Triton reloads the model from its
    repository); a config (Triton's JSON, as ``parameters.config``) sets it, or is refused whole. Either
    holds for every process of the server (dataplane.batching) once this returns."""
    worker = state.worker
    assert worker is not None
    if text is None:
        await state.batching.apply(op, None)
        return
    asked, served = _parsed(text), model_config(state, op)
    normal, served_normal = _normal(asked), _normal(served)
    for key, value in normal.items():
        if key not in HONOURED and value != served_normal.get(key):
            raise InvalidRequest(f"vkact applies only {' and '.join(HONOURED)} from a config; {key} differs from the "
                                 f"model's ({json.dumps(served.get(key))})", f"config.{key}")
    # The config is the model's whole configuration, as Triton takes it: no max_batch_size is 0, no
    # dynamic_batching is none; fields it leaves out besides those keep the served values.
    size = int(normal.get("max_batch_size", 0))
    if size < 0:
        raise InvalidRequest(f"max_batch_size must be at least 0, got {size}", "config.max_batch_size")
    if size > 0 and not batches(op):
        raise InvalidRequest(f"model {short_name(op)!r} is a reduction: it runs each request alone (max_batch_size 0)",
                             "config.max_batch_size")
    if size > worker.max_batch:
        raise InvalidRequest(f"max_batch_size is at most {worker.max_batch} here (VKACT_MAX_BATCH)", "config.max_batch_size")
    dynamic = "dynamic_batching" in asked
    for key in normal.get("dynamic_batching", {}):  # only what differs from the defaults is there
        raise InvalidRequest(f"vkact's dynamic batching never waits and has no other setting ({key})", f"config.dynamic_batching.{key}")
    if dynamic and size == 0:
        raise InvalidRequest("dynamic_batching needs max_batch_size above 0", "config.dynamic_batching")
    await state.batching.apply(op, Batching(size, dynamic))


def refuse_load_parameters(names: Any) -> None:
    """A load's parameters other than ``config`` (Triton's "file:..." model files): vkact has none."""
    for name in names:
        raise InvalidRequest(f"vkact's models are built in: a load takes only a config, not {name!r}", name)


def _parsed(text: str) -> dict[str, Any]:
    try:
        asked = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"the config is not JSON: {exc}", "config") from None
    except RecursionError:  # json's decoder recurses once per level: a 400, never a 500
        raise InvalidRequest("the config is not JSON: nested too deeply", "config") from None
    if not isinstance(asked, dict):
        raise InvalidRequest("the config must be a JSON object (Triton's model configuration)", "config")
    return asked


def _normal(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as Triton's ModelConfig message reads it (fields at their defaults left out, int64 as
    text), so a config read over gRPC or HTTP compares equal to the served one."""
    from google.protobuf import json_format

    from .grpc.messages import config_pb  # compiles the .proto files: only when a config is loaded

    try:
        message = json_format.ParseDict(config, config_pb.ModelConfig())
    except json_format.ParseError as exc:
        raise InvalidRequest(f"the config is not a Triton model configuration: {exc}", "config") from None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
