"""GET /grpc/vkact.protoset: the gRPC services vkact serves (Triton's GRPCInferenceService with its
model_config.proto, and grpc.health.v1) as a FileDescriptorSet, so grpcurl and other dynamic clients
need no .proto files (``grpcurl -protoset vkact.protoset``): the descriptor set that server
reflection would hand out, served over HTTP."""
from __future__ import annotations

import functools

from fastapi import APIRouter
from fastapi.responses import Response
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

router = APIRouter(tags=["grpc"])

PROTOSET_TYPE = "application/octet-stream"


@functools.cache
def protoset() -> bytes:
    from grpc_health.v1 import health_pb2

    from .messages import config_pb, pb  # compiles the .proto files: on first use only

    files: list[FileDescriptor] = []

    def add(f: FileDescriptor) -> None:  # each file after the files it imports, as protoc writes a set
        if f in files:
            return
        for dependency in f.dependencies:
            add(dependency)
        files.append(f)

    for module in (config_pb, pb, health_pb2):
        add(module.DESCRIPTOR)
    out = descriptor_pb2.FileDescriptorSet()
    for f in files:
        f.CopyToProto(out.file.add())
    return out.SerializeToString()


@router.get("/grpc/vkact.protoset", summary="The gRPC services as a FileDescriptorSet (grpcurl -protoset)",
            response_class=Response, responses={200: {"content": {PROTOSET_TYPE: {}}}})
async def descriptor_set() -> Response:
    return Response(protoset(), media_type=PROTOSET_TYPE,
                    headers={"Content-Disposition": 'attachment; filename="vkact.protoset"'})
