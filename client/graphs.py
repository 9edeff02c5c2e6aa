"""Graphs of operators (DirectML's DML_GRAPH_DESC), built with the operator methods and compiled once.

    with Client() as vk:
        g = vk.graph()
        x = g.input("x", (3, 5), np.float32)
        y = g.shrink(g.scaled_tanh(g.linear(x, alpha=1.7)), bias=0.1)   # the client's own methods
        f = g.compile(y=y)                                                 # outputs by name
        out = f(x=np.ones((3, 5), np.float32))                             # {"y": array}
        f.report                       # the service's answer: {"Fused": True, "Dispatches": 1, ...}

A ``GraphBuilder`` has every operator method of ``Client``; each records a node instead of running it
and returns a ``Node`` (a symbolic tensor) that later methods take as an input. ``compile`` keeps the
nodes that lead to the named outputs, writes the DML_GRAPH_DESC (inputs and outputs named by their
edges) and the JSON text of the request around it once; each call sends only that text and the arrays.
The service fuses the graph into as few dispatches as it can, bit-identical to its nodes run one by one,
and keeps the compiled form for the next call. ``AsyncClient.graph()`` builds the same, awaited calls.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np
import numpy.typing as npt

from . import codec
from ._operators import OperatorMethods
from .buffers import min_buffer_bytes
from .codec import CodecError, Encoding
from .errors import ProtocolError
from .tensors import Layout, data_type_name, output_desc

if TYPE_CHECKING:
    from ._client import _BaseClient


@dataclass(frozen=True, eq=False)
class Node:
    """A tensor of a graph being built: a graph input (``index`` None) or a node's output."""

    builder: GraphBuilder
    desc: dict[str, Any]            # its DML_BUFFER_TENSOR_DESC
    index: Optional[int] = None     # the node that makes it
    name: Optional[str] = None      # a graph input's name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.desc["Sizes"])


@dataclass(frozen=True)
class _Recorded:
    desc: dict[str, Any]            # the operator descriptor, tensors included
    fields: tuple[str, ...]         # its input tensor fields
    inputs: tuple[Node, ...]


class GraphBuilder(OperatorMethods[Node]):
    """Records operator calls as graph nodes (``client.graph()`` makes one bound to its client)."""

    def __init__(self, client: _BaseClient) -> None:
        self._client = client
        self._inputs: dict[str, Node] = {}
        self._nodes: list[_Recorded] = []

    def input(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike = np.float32) -> Node:
        """A graph input named ``name``: a packed tensor of ``shape`` and ``dtype``."""
        if not isinstance(name, str) or not name:
            raise ValueError("a graph input needs a name")
        if name in self._inputs:
            raise ValueError(f"the graph already has an input named {name!r}")
        dt = np.dtype(dtype)
        sizes = [int(s) for s in shape] or [1]
        desc = {"DataType": data_type_name(dt), "Sizes": sizes, "TotalTensorSizeInBytes": min_buffer_bytes(dt.itemsize, tuple(sizes), None)}
        node = self._inputs[name] = Node(self, desc, name=name)
        return node

    def execute(self, operator: Any, *arrays: Any, params: Optional[Mapping[str, Any]] = None, **options: Any) -> Node:
        """Record one operator on graph tensors (what every operator method calls)."""
        from ._client import _UNARY, _operator

        if any(value not in (None, False) for value in options.values()):
            raise TypeError(f"a graph node takes no {', '.join(k for k, v in options.items() if v not in (None, False))}: "
                            "a graph's tensors are packed, its inputs read-only")
        desc, info = _operator(operator, params)
        fields, output = (info.inputs, info.output) if info else _UNARY
        if len(arrays) != len(fields):
            raise TypeError(f"{desc['Type']} takes {len(fields)} tensor(s) ({', '.join(fields)}), got {len(arrays)}")
        for a in arrays:
            if not isinstance(a, Node) or a.builder is not self:
                raise TypeError("a graph node's inputs are this graph's tensors (its input() or another node's result), "
                                f"not {type(a).__name__}")
        tensors = {f: a.desc for f, a in zip(fields, arrays)}
        out = output_desc(arrays[0].desc, None)
        self._nodes.append(_Recorded({"Type": desc.pop("Type"), **tensors, output: out, **desc}, tuple(fields), tuple(arrays)))
        return Node(self, out, index=len(self._nodes) - 1)

    def compile(self, outputs: Optional[Mapping[str, Node]] = None, /, **named: Node) -> CompiledGraph:
        """The graph that makes ``outputs`` (by name), ready to call on arrays by input name."""
        chosen = {**(outputs or {}), **named}
        if not chosen:
            raise ValueError("name the graph's outputs: compile(y=node)")
        for name, node in chosen.items():
            if not isinstance(node, Node) or node.builder is not self or node.index is None:
                raise TypeError(f"output {name!r} must be a node of this graph (an operator method's result)")
        return CompiledGraph(self._client, self._desc(chosen))

    def _desc(self, outputs: dict[str, Node]) -> dict[str, Any]:
        """The DML_GRAPH_DESC of the nodes that lead to ``outputs`` (renumbered, in recording order)."""
        needed: set[int] = set()
        stack = [n.index for n in outputs.values()]
        while stack:
            i = stack.pop()
            if i is not None and i not in needed:
                needed.add(i)
                stack += [a.index for a in self._nodes[i].inputs]
        order = sorted(needed)
        number = {old: new for new, old in enumerate(order)}
        used = [name for name in self._inputs if any(a.name == name for i in order for a in self._nodes[i].inputs)]
        input_edges, intermediate = [], []
        for i in order:
            for slot, a in enumerate(self._nodes[i].inputs):
                if a.index is None:
                    input_edges.append({"GraphInputIndex": used.index(a.name), "ToNodeIndex": number[i], "ToNodeInputIndex": slot, "Name": a.name})
                else:
                    intermediate.append({"FromNodeIndex": number[a.index], "FromNodeOutputIndex": 0, "ToNodeIndex": number[i], "ToNodeInputIndex": slot})
        return {
            "InputCount": len(used),
            "OutputCount": len(outputs),
            "Nodes": [{"Operator": self._nodes[i].desc} for i in order],
            "InputEdges": input_edges,
            "OutputEdges": [{"FromNodeIndex": number[node.index], "FromNodeOutputIndex": 0, "GraphOutputIndex": j, "Name": name}
                            for j, (name, node) in enumerate(outputs.items()) if node.index is not None],
            "IntermediateEdges": intermediate,
        }


class CompiledGraph:
    """A graph ready to run: ``f(x=array, ...)`` returns ``{output name: array}`` (on an AsyncClient's
    graph, an awaitable of it). ``desc`` is its DML_GRAPH_DESC; ``report`` the service's word on how it
    last ran (``Fused``, ``Dispatches``, ``Nodes``, ``Notes``: why parts run node by node)."""

    def __init__(self, client: _BaseClient, desc: dict[str, Any]) -> None:
        self._client = client
        self.desc = desc
        self.report: Optional[dict[str, Any]] = None
        self.inputs: dict[str, dict[str, Any]] = {}
        for e in desc["InputEdges"]:
            self.inputs.setdefault(e["Name"], desc["Nodes"][e["ToNodeIndex"]]["Operator"][_input_field(desc, e)])
        self.outputs = tuple(e["Name"] for e in desc["OutputEdges"])
        self._graph_text = json.dumps(desc, separators=(",", ":"))   # written once, sent with every call

    def __call__(self, inputs: Optional[Mapping[str, npt.ArrayLike]] = None, /, *, encoding: Union[Encoding, str, None] = None,
                 **named: npt.ArrayLike) -> Any:
        return self._client._run_graph(self, {**(inputs or {}), **named}, encoding)

    def __repr__(self) -> str:
        return f"CompiledGraph({len(self.desc['Nodes'])} nodes, inputs {list(self.inputs)}, outputs {list(self.outputs)})"

    # -- the request and the answer (no I/O) ------------------------------------------------------

    def request_content(self, arrays: Mapping[str, npt.ArrayLike], encoding: Encoding) -> dict[str, Any]:
        """httpx's content and headers for one call."""
        unknown = [name for name in arrays if name not in self.inputs]
        if unknown:
            raise TypeError(f"the graph has no input {unknown[0]!r}; its inputs are {', '.join(self.inputs)}")
        buffers = {}
        for name, desc in self.inputs.items():
            if name not in arrays:
                raise TypeError(f"missing the graph input {name!r}")
            a = np.asarray(arrays[name])
            dtype = np.dtype(codec_dtype(desc))
            if a.dtype != dtype or list(a.shape or (1,)) != list(desc["Sizes"]):
                raise ValueError(f"graph input {name!r} is {list(desc['Sizes'])} of {dtype}, got {list(a.shape)} of {a.dtype}")
            raw = np.ascontiguousarray(a, dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
            buffer = np.zeros(desc["TotalTensorSizeInBytes"], np.uint8)
            buffer[: raw.nbytes] = raw
            buffers[name] = buffer
        span = {name: int(np.prod(d["Sizes"])) * codec_dtype(d).itemsize for name, d in self.inputs.items()}
        data = {name: codec.encode_data(b, codec_dtype(self.inputs[name]), span[name], encoding) for name, b in buffers.items()}
        head = ('{"Graph":' + self._graph_text + ',"Inputs":' + json.dumps(data, separators=(",", ":")) +
                ',"ResponseEncoding":"' + encoding.value + '"}').encode()
        if encoding is Encoding.BINARY:
            content = b"".join([head, *(b.tobytes() for b in buffers.values())])
            return {"content": content, "headers": {"Content-Type": codec.BINARY_CONTENT_TYPE, codec.HEADER_LENGTH: str(len(head))}}
        return {"content": head, "headers": {"Content-Type": "application/json"}}

    def read_answer(self, body: bytes, header_length: Optional[str]) -> dict[str, np.ndarray]:
        try:
            header, tail = codec.split_frame(body, header_length)
            outputs, descs = header["Outputs"], header["OutputTensors"]
            slices = codec.binary_slices(list(outputs.items()), tail)
            result = {}
            for name in self.outputs:
                layout = Layout.of(descs[name])
                result[name] = layout.to_array(codec.decode_data(outputs[name], layout.dtype, layout.total, layout.span, name, slices.get(name)))
            self.report = header["Compiled"]
        except (CodecError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"malformed graph response: {exc}") from exc
        return result


def codec_dtype(desc: dict[str, Any]) -> np.dtype:
    return Layout.of(desc).dtype


def _input_field(desc: dict[str, Any], edge: dict[str, Any]) -> str:
    """The tensor field of the node input an input edge binds (the operator's inputs, in order)."""
    from ._client import _UNARY
    from ._operators import BY_TYPE

    op = desc["Nodes"][edge["ToNodeIndex"]]["Operator"]
    info = BY_TYPE.get(op["Type"])
    return (info.inputs if info else _UNARY[0])[edge["ToNodeInputIndex"]]
