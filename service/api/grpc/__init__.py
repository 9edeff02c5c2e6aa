"""The Open Inference Protocol over gRPC (Triton's GRPCInferenceService) and grpc.health.v1, on vkact's
own HTTP/2 transport (a front-end: the wire format, over the data plane)."""
