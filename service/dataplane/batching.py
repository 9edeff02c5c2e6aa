"""The operator models' batching as load_model with a config sets it (max_batch_size, dynamic_batching;
api/model_config.py validates the config), held for the whole server as its graph models are: a small
document in /dev/shm (shared_file.SharedFile, slots.server_file("batching", ...)) that every HTTP
process (``--workers N``) reads, and with it the device worker handle of each (worker.DeviceWorker
asks ``limit`` how many queued jobs of a model may run as one dispatch).

Triton's semantics: a load with a config applies it at once everywhere; a load without one restores
the served batching (Triton reloads the model from its repository); operator models are built in and
never unloaded. The document outlives a restart of an HTTP process (it is the server's, named after
the supervisor, as the graph models and the shared memory registrations are) and goes with the server
(a server started anew serves the models as configured, as Triton restarted serves its repository)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..operators import OperatorDesc, short_name
from ..shared_file import Commit, SharedFile, in_thread
from .models import MODELS

# How long the device worker handle's view of the document is taken as current. It asks per queued
# job; a stat per job (and the exception of an absent file, the usual case) cost gRPC 7% of its
# requests/s under h2load (10,070 against 10,982, 8 alternated rounds, load 1.2-1.5). A load through
# this process is seen at once (apply); one through another process within this time.
LIMIT_FRESH_S = 0.05


@dataclass(frozen=True)
class Batching:
    max_batch_size: int   # Triton's: 0, the model does not batch
    dynamic: bool         # dynamic_batching present: queued requests run together

    @property
    def limit(self) -> int:
        """Jobs per dispatch in the device worker."""
        return self.max_batch_size if self.dynamic and self.max_batch_size > 1 else 1


def batches(op: type[OperatorDesc]) -> bool:
    """Whether the device worker can run several of this model's requests as one dispatch."""
    return op.kind == "elementwise"


Loaded = dict[type[OperatorDesc], Batching]


def _decode(data: Any) -> Loaded:
    """The document: model name -> {"max_batch_size": N, "dynamic_batching": bool}."""
    return {MODELS[name]: Batching(int(entry["max_batch_size"]), bool(entry["dynamic_batching"]))
            for name, entry in data.items() if name in MODELS}


def _encode(loaded: Loaded) -> dict[str, dict[str, Any]]:
    return {short_name(op): {"max_batch_size": b.max_batch_size, "dynamic_batching": b.dynamic} for op, b in loaded.items()}


class ModelBatching:
    """The batching loaded with a config, by operator model, for one server (see the module)."""

    def __init__(self, path: str) -> None:
        self._file: SharedFile[Loaded] = SharedFile(path, "model batching file", _decode, _encode, dict)
        self._loaded: Loaded = {}
        self._fresh_until = 0.0

    @property
    def path(self) -> str:
        return self._file.path

    def get(self, op: type[OperatorDesc]) -> Batching | None:
        """The batching ``op``'s model was loaded with; None: the service's (never loaded with a config)."""
        return self._file.current().get(op)

    def limit(self, op: type[OperatorDesc]) -> int | None:
        """Queued jobs of ``op`` per dispatch as its loaded config allows; None: the service's limit."""
        now = time.monotonic()
        if now >= self._fresh_until:
            self._loaded, self._fresh_until = self._file.current(), now + LIMIT_FRESH_S
        loaded = self._loaded.get(op)
        return None if loaded is None else loaded.limit

    async def apply(self, op: type[OperatorDesc], batching: Batching | None) -> None:
        """Set ``op``'s batching for every process of the server (None: the service's again); the file's
        lock and write run off the event loop, and a caller cancelled before the write changes nothing.
        SharedFileWriteFailed (507) when /dev/shm is full: nothing changed."""
        try:
            await in_thread(lambda commit: self._apply(op, batching, commit))
        finally:
            self._fresh_until = 0.0  # limit() reads the document again

    def _apply(self, op: type[OperatorDesc], batching: Batching | None, commit: Commit) -> None:
        with self._file.changing(commit) as loaded:
            if batching is None:
                loaded.pop(op, None)
            else:
                loaded[op] = batching

    def close(self) -> None:
        """At shutdown: the server's loaded batching is forgotten with it."""
        self._file.close()
