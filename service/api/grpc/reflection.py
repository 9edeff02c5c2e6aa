"""gRPC server reflection on vkact's own transport: grpcio-reflection's servicer (its asyncio one, which
answers each request of the stream from the process's descriptor pool) behind a bidirectional Route,
at grpc.reflection.v1alpha's path and at v1's (the same messages on the wire), so grpcurl and
grpcio-reflection's client list and call the services without .proto files."""
from __future__ import annotations

from collections.abc import AsyncIterator

from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from ...errors import InvalidRequest
from .transport import Route, Send

PATHS = ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
SERVICE_NAMES = ("grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection")


def reflection_routes(service_names: tuple[str, ...]) -> dict[str, Route]:
    """The reflection routes, listing ``service_names`` and reflection itself (the descriptors of the
    services' files must be in protobuf's default pool: grpc.messages compiles them there)."""
    servicer = ReflectionServicer((*service_names, *SERVICE_NAMES))

    async def info(messages: AsyncIterator[bytes], send: Send) -> None:
        async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            async for data in messages:
                try:
                    yield reflection_pb2.ServerReflectionRequest.FromString(data)
                except DecodeError:
                    raise InvalidRequest("the request is not a grpc.reflection ServerReflectionRequest message") from None

        async for response in servicer.ServerReflectionInfo(requests(), None):
            send(response.SerializeToString())

    return {path: Route(bidi=info) for path in PATHS}
