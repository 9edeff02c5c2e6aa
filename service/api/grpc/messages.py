"""Triton's gRPC protocol (package ``inference``, service GRPCInferenceService): grpc_service.proto and
model_config.proto, vendored unchanged in service/grpc_proto/ (BSD-3, triton-inference-server/common),
compiled when this module is first imported by grpcio-tools' protoc (grpc.protos_and_services).

Compiled here rather than taken from tritonclient's generated modules: the service then needs no client
package at run time, and no generated file lives in the tree. The descriptors are byte-identical to
tritonclient 2.73.0's, so both can load in one process (protobuf refuses two different files of one name)."""
from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import grpc

PROTO_DIR = Path(__file__).resolve().parents[2] / "grpc_proto"


def _compile() -> tuple[ModuleType, ModuleType]:
    # protoc resolves the file and its import (model_config.proto) on sys.path: the directory is put
    # there for the call only; the modules register as grpc_service_pb2 and model_config_pb2.
    sys.path.insert(0, str(PROTO_DIR))
    try:
        return grpc.protos_and_services("grpc_service.proto")
    finally:
        sys.path.remove(str(PROTO_DIR))


pb, services = _compile()
config_pb = sys.modules["model_config_pb2"]
