"""/v1: DirectML's own shape over HTTP (a front-end: the wire format, over the data plane)."""
