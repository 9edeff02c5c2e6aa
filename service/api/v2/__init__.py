"""/v2: the Open Inference Protocol over HTTP with Triton's extensions (a front-end: the wire format,
over the data plane)."""
