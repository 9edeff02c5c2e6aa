"""Graph models: DML_GRAPH_DESC graphs loaded as Open Inference Protocol models through Triton's model
repository extension (/v2's POST /v2/repository/models/{name}/load with the graph's JSON as
``parameters.config``, gRPC's RepositoryModelLoad), beside the operator models of models.py.

A graph is validated (graphs.parse: DirectML's rules, a 422 naming the field), checked against the
device's limits (graphs.check_limits) and compiled (graphs.compile_graph, in a thread: glslang runs
there) once, at load; each inference then runs the compiled graph (graphs.run_graph). Its inputs and outputs are the graph's input and output edges, named by their ``Name``s, each with
the one data type and shape of its tensor descriptor (packed: the protocol's tensors are row-major).

The registry belongs to the data plane (the front-ends only translate) and to the whole server: what
is loaded is a file in /dev/shm that every HTTP process (``--workers N``) reads (GraphModels), so a
load through one connection serves inferences on any other. A name never shadows an operator model,
at most ``Settings.max_graph_models`` are loaded per server (VKACT_MAX_GRAPH_MODELS), a reload
replaces the model at once everywhere (requests already running finish on the model they started
with; the replacement is compiled before it is swapped in), and an unload forgets it (likewise). Each
graph model has Triton's per-model statistics in each process (as every model's are), registered when
the process first sees it and dropped when it is unloaded.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any

from client.codec import CodecError, parse_header

from ..config import Settings
from ..descriptors import packed_strides
from ..descriptors.graph import GraphDesc
from ..descriptors.tensor import TensorDesc
from ..errors import DescriptorError, InvalidRequest, UnknownOperator
from ..shared_file import ATTACHMENT_TOKEN, Commit, SharedFile, in_thread
from . import graphs
from .graphs import CompiledGraph
from .metrics import MODEL_VERSION, ModelStats, TritonMetrics
from .models import DML_TO_V2, MODELS

PLATFORM = "vkact_directml_graph"
#: A graph model's name: what a URL path segment and a metric label carry without escaping. "stats"
#: would be taken by GET /v2/models/stats (the statistics of every model).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
RESERVED_NAMES = frozenset({"stats"})
#: What a graph model's inference counts its failures against until it is answered (count_error
#: finds the model's statistics by it); vkact's own series count every graph under graphs.GRAPH_LABEL,
#: so names loaded and unloaded by the thousand never grow them.
LABEL_PREFIX = "graph:"


@dataclass(frozen=True)
class GraphTensor:
    """One input or output of a graph model: its edge's name, the protocol's datatype, its shape."""

    name: str
    desc: TensorDesc

    @property
    def datatype(self) -> str:
        return DML_TO_V2[self.desc.DataType]

    @property
    def shape(self) -> list[int]:
        return list(self.desc.Sizes)

    @property
    def nbytes(self) -> int:
        """The protocol's tensor: its elements, packed (the descriptor's buffer may be rounded up)."""
        return prod(self.desc.Sizes) * self.desc.DataType.info.size


@dataclass(frozen=True)
class GraphModel:
    name: str
    compiled: CompiledGraph
    inputs: tuple[GraphTensor, ...]     # in graph input index order
    outputs: tuple[GraphTensor, ...]    # in graph output index order
    stats: ModelStats = field(compare=False, repr=False)
    serial: str = ""   # the load it came from (GraphModels: each load makes a new one)

    @property
    def graph(self) -> GraphDesc:
        return self.compiled.graph

    @property
    def label(self) -> str:
        """What its failures count against (see LABEL_PREFIX)."""
        return LABEL_PREFIX + self.name

    def report(self) -> dict[str, str]:
        """What the tensors cannot say, for metadata and config parameters: whether the graph fused and
        why not (graph_fused, graph_notes), its dispatches and nodes."""
        return self.compiled.report.parameters()

    def metadata(self) -> dict[str, Any]:
        """$metadata_model_response: the edges' names, data types and shapes."""
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": PLATFORM,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in self.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in self.outputs],
            "parameters": self.report(),
        }

    def config(self) -> dict[str, Any]:
        """Triton's model configuration: fixed dims, no batching (a graph's tensors are its descriptors)."""
        return {
            "name": self.name,
            "platform": PLATFORM,
            "backend": "vkact",
            "max_batch_size": 0,
            "version_policy": {"specific": {"versions": [int(MODEL_VERSION)]}},
            "input": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "format": "FORMAT_NONE", "dims": t.shape} for t in self.inputs],
            "output": [{"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": t.shape} for t in self.outputs],
            "parameters": {key: {"string_value": value} for key, value in self.report().items()},
        }


def is_graph_config(text: str) -> bool:
    """Whether a load's config is a graph (DML_GRAPH_DESC has Nodes; Triton's model configuration never does)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply: not a graph (the caller says why)
        return False
    return isinstance(data, dict) and "Nodes" in data


def _tensors(graph: GraphDesc) -> tuple[tuple[GraphTensor, ...], tuple[GraphTensor, ...]]:
    """The graph's inputs and outputs as the protocol's tensors; a strided one has no row-major form."""
    def tensor(kind: str, field: str, name: str, desc: TensorDesc) -> GraphTensor:
        if desc.DataType not in DML_TO_V2:
            raise DescriptorError(field, f"graph {kind} {name!r} is {desc.DataType.value}, which the protocol has no datatype for")
        if desc.Strides is not None and tuple(desc.Strides) != packed_strides(desc.Sizes):
            raise DescriptorError(field, f"graph {kind} {name!r} has Strides {list(desc.Strides)}: a model's tensors are packed "
                                  "and row-major (run strided graph tensors through /v1/execute's Graph)")
        return GraphTensor(name, desc)

    edge_in = {e.GraphInputIndex: i for i, e in enumerate(graph.InputEdges)}
    edge_out = {e.GraphOutputIndex: i for i, e in enumerate(graph.OutputEdges)}
    inputs = tuple(tensor("input", f"Graph.InputEdges[{edge_in[i]}]", name, graph.input_desc(i)) for i, name in enumerate(graph.input_names()))
    outputs = tuple(tensor("output", f"Graph.OutputEdges[{edge_out[j]}]", name, graph.output_desc(j)) for j, name in enumerate(graph.output_names()))
    return inputs, outputs


def _decode(data: Any) -> dict[str, str]:
    return {str(name): str(serial) for name, serial in data.items()}


def _same(entries: dict[str, str]) -> dict[str, str]:
    return entries


class GraphModels:
    """The graph models of one server, by name, for each of its HTTP processes.

    What is loaded is the server's graph file (shared_file.SharedFile: name -> serial, a token that each
    load makes anew; the config it was loaded with is the file's attachment of that serial), which every
    load, reload and unload changes under its lock, whichever process took the request; the limit
    counts its entries. Each process compiles a model the first time it sees its serial (the
    compiler caches programs by structure, so a model another process loaded costs this one a parse
    and a plan, and glslang only for a structure new to it), once for the device's limits: a model
    looked up before the device worker reported is compiled again once when it has, and kept."""

    def __init__(self, settings: Settings, triton: TritonMetrics, path: str, device: Callable[[], dict | None]) -> None:
        self.settings = settings
        self._triton = triton
        self._file: SharedFile[dict[str, str]] = SharedFile(path, "graph model file", _decode, _same, dict)
        self._device = device
        self._models: dict[str, GraphModel] = {}   # compiled here, by name (a serial the file may have replaced)
        self._compiling: dict[tuple[str, str, int | None], asyncio.Future[GraphModel | None]] = {}
        self._synced: dict[str, str] | None = None   # the file's entries this process last saw
        self._lock: asyncio.Lock | None = None  # loads one at a time (made on the event loop)

    def _entries(self) -> dict[str, str]:
        """The file's entries; a model gone from it (unloaded anywhere) is forgotten here with its
        statistics, and one new to this process gets them (at zero)."""
        entries = self._file.current()
        if entries is not self._synced:
            for name in [n for n in self._models if n not in entries]:
                del self._models[name]
            for name in (self._synced or {}):
                if name not in entries:
                    self._triton.drop_model(name)
            for name in entries:
                if self._triton.model(name) is None:
                    self._triton.add_model(name)
            self._synced = entries
        return entries

    def has(self, name: str) -> bool:
        """Whether a graph model ``name`` is loaded (through any of the server's processes)."""
        return name in self._entries()

    def names(self) -> list[str]:
        return sorted(self._entries())

    def check(self, name: str, version: str | None = None) -> str:
        """The serial of graph model ``name`` in the file; UnknownOperator (404), naming the version, when
        there is no such model."""
        entry = self._entries().get(name)
        if entry is None:
            raise UnknownOperator(f"unknown model {name!r}: no operator model and no loaded graph model has that name")
        if version is not None and version != MODEL_VERSION:
            raise UnknownOperator(f"model {name!r} has no version {version!r}; its only version is {MODEL_VERSION}")
        return entry

    async def find(self, name: str, version: str | None = None) -> GraphModel:
        """The loaded graph model ``name``, compiled by this process for the device (the first lookup
        of a serial compiles it; lookups meanwhile wait for that compilation); UnknownOperator (404),
        naming the version, when there is no such model."""
        for _ in range(3):   # a reload or unload elsewhere may take the config away as it is read
            serial = self.check(name, version)
            device = self._device()
            storage_buffers = graphs.device_storage_buffers(device) if device is not None else None
            model = self._models.get(name)
            if model is not None and model.serial == serial and (device is None or model.compiled.storage_buffers == storage_buffers):
                return model
            key = (name, serial, storage_buffers)
            pending = self._compiling.get(key)
            if pending is None:
                pending = self._compiling[key] = asyncio.ensure_future(self._compile(name, serial, storage_buffers))
                pending.add_done_callback(lambda _, key=key: self._compiling.pop(key, None))
            model = await asyncio.shield(pending)   # one caller's cancellation leaves the others their model
            if model is None:
                continue
            if self._file.current().get(name) == serial:   # not replaced or unloaded meanwhile
                self._models[name] = model
            return model
        raise UnknownOperator(f"graph model {name!r} is being replaced or unloaded: retry")

    async def _compile(self, name: str, serial: str, storage_buffers: int | None) -> GraphModel | None:
        """Model ``name`` as loaded with ``serial``, compiled; None when its config is gone (replaced or
        unloaded since the file was read)."""
        parsed = await asyncio.to_thread(self._read_and_parse, serial)
        if parsed is None:
            return None
        graph, inputs, outputs = parsed
        return self._model(name, await graphs.compile_graph(self.settings, graph, storage_buffers), inputs, outputs, serial)

    def _read_and_parse(self, serial: str) -> tuple[GraphDesc, tuple[GraphTensor, ...], tuple[GraphTensor, ...]] | None:
        text = self._file.attached(serial)
        return None if text is None else self._parse(text)

    async def load(self, name: str, text: str, device: dict | None) -> GraphModel:
        """Validate and compile the graph ``text`` (DML_GRAPH_DESC's JSON) as model ``name``, then put
        it in place of any model of that name, for every process of the server. Nothing changes (no
        attachment, no entry) when it fails or is cancelled (its client left, its deadline passed)
        before the file is written; once written the load is complete, and a cancellation then comes
        after it. Loads of one name at once: the last to write wins, whole. ``device``: the ready
        worker's report, once the device is known (its limits: every inference checks them too)."""
        self._check_name(name)
        self._check_room(name, self._entries())
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one at a time, as Triton's loads: the last of two loads of a name wins
            # parsed (up to GRAPH_CONFIG_BYTES of JSON) and compiled (glslang) off the event loop
            graph, inputs, outputs = await asyncio.to_thread(self._parse, text)
            if device is not None:
                graphs.check_limits(graph, device["max_tensor_bytes"], self.settings.pool_bytes)
            compiled = await graphs.compile_graph(self.settings, graph, graphs.device_storage_buffers(device) if device else None)
            serial = os.urandom(ATTACHMENT_TOKEN // 2).hex()
            # the files' lock and writes, off the event loop; cancelled before its write, nothing is stored
            await in_thread(lambda commit: self._store(name, serial, text, commit))
        self._entries()
        model = self._models[name] = self._model(name, compiled, inputs, outputs, serial)
        return model

    def _model(self, name: str, compiled: CompiledGraph, inputs: tuple[GraphTensor, ...], outputs: tuple[GraphTensor, ...], serial: str) -> GraphModel:
        return GraphModel(name, compiled, inputs, outputs, self._triton.model(name) or self._triton.add_model(name), serial)

    def _store(self, name: str, serial: str, text: str, commit: Commit) -> None:
        self._file.attach(serial, text)   # first: a process that reads the new entry finds its config
        replaced = None
        try:
            with self._file.changing(commit) as entries:
                self._check_room(name, entries)   # counted again under the lock: another process may have loaded one
                replaced, entries[name] = entries.get(name), serial
        except BaseException:   # refused, abandoned (the load was cancelled), or not written
            self._file.detach(serial)
            raise
        if replaced is not None:
            self._file.detach(replaced)

    def _parse(self, text: str) -> tuple[GraphDesc, tuple[GraphTensor, ...], tuple[GraphTensor, ...]]:
        try:  # 400s, never a RecursionError: text nested too deeply, an integer too long, not an object
            data = parse_header(memoryview(text.encode("utf-8", "surrogatepass")))
        except CodecError as exc:
            raise InvalidRequest(f"the config is not a JSON object (a DML_GRAPH_DESC): {exc.message}", "config") from None
        graph = graphs.parse(data, self.settings)
        return (graph, *_tensors(graph))

    async def unload(self, name: str) -> None:
        """Forget graph model ``name`` in every process (requests running on it finish); UnknownOperator
        when none is loaded."""
        await in_thread(lambda commit: self._remove(name, commit))
        self._entries()

    def _remove(self, name: str, commit: Commit) -> None:
        with self._file.changing(commit) as entries:
            serial = entries.pop(name, None)
            if serial is None:
                raise UnknownOperator(f"unknown model {name!r}: no operator model and no loaded graph model has that name")
        self._file.detach(serial)

    def close(self) -> None:
        """At shutdown: forget the server's graph models."""
        self._file.close()

    def _check_name(self, name: str) -> None:
        if name in MODELS:
            raise InvalidRequest(f"{name!r} is an operator model, built in: a graph model needs a name of its own", "name")
        if not NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise InvalidRequest(f"a graph model's name is 1 to 128 of A-Z a-z 0-9 _ . - (not starting with . or -, "
                                 f"not {', '.join(sorted(RESERVED_NAMES))}); got {name[:160]!r}", "name")

    def _check_room(self, name: str, entries: dict[str, str]) -> None:
        limit = self.settings.max_graph_models
        taken = len(entries)
        if name not in entries and taken >= limit:
            raise InvalidRequest(f"{taken} graph models are loaded, the most this service holds (VKACT_MAX_GRAPH_MODELS={limit}): "
                                 "unload one first", "name")
