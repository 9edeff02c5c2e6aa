"""vkact's Python client (numpy and httpx only): DirectML activation operators over HTTP.

    import numpy as np
    from client import Client

    with Client("http://127.0.0.1:8000") as vk:
        y = vk.shrink(np.linspace(-1, 1, 8, dtype=np.float32), bias=0.1, threshold=0.5)
        z = vk.execute("DML_OPERATOR_ACTIVATION_CELU", y, params={"Alpha": 2.0}, encoding="json")

Graphs: ``g = vk.graph()``, nodes from the same methods (``y = g.shrink(g.linear(g.input("x", (8,))))``),
``f = g.compile(y=y)`` once, then ``f(x=array)`` -> ``{"y": array}`` (see client.graphs).

``AsyncClient`` has the same methods, awaited (``async with AsyncClient() as vk: await vk.celu(x)``).
Errors are ``VkactError`` subclasses; see ``client.errors`` for the tree.
"""
from ._client import DEFAULT_BASE_URL, AsyncClient, Client
from ._operators import OPERATORS, OperatorInfo
from .codec import Encoding
from .graphs import CompiledGraph, GraphBuilder, Node
from .errors import (
    BadRequest,
    InternalServerError,
    InvalidDescriptor,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    ServerError,
    ServiceBusy,
    Timeout,
    TransportError,
    VkactError,
)

__all__ = [
    "DEFAULT_BASE_URL", "OPERATORS", "AsyncClient", "BadRequest", "Client", "CompiledGraph", "Encoding", "GraphBuilder", "InternalServerError",
    "InvalidDescriptor", "Node", "NotFound", "OperatorInfo", "PayloadTooLarge", "ProtocolError", "ServerError",
    "ServiceBusy", "Timeout", "TransportError", "VkactError",
]
