"""The data plane under every front-end (/v1, /v2 over HTTP, gRPC), as MLServer's handlers/dataplane.py
and KServe's protocol/dataplane.py sit under their REST and gRPC servers: what a request means to the
device, whatever wire it came on. It knows nothing of HTTP, gRPC or JSON.

- models.py: the operators as models (names, versions, inputs and outputs, data types), from the registry
- execution.py: the call to the device worker (timeout, the client's departure) and the bookkeeping of
  an answer
- metrics.py: every series and Triton's per-model statistics, counted once for all front-ends
- readiness.py: whether the device can take inferences (one answer for every probe and route)
- graphs.py: graphs (DML_GRAPH_DESC) parsed, compiled in a thread, limited, run by input and output edge
  names and counted, for every front-end
- graph_models.py: graphs loaded as /v2 and gRPC models (the repository extension), compiled once at load
- batching.py: the operator models' batching set by load_model with a config, the server's (a /dev/shm file)
- limits (service/limits.py): the fixed limits, in one place
- descriptor_key: the canonical key of a descriptor (service/descriptors/canonical.py), which each front-end
  computes once per request and its header cache keeps

The front-ends (service/api/v1, v2, grpc) translate their wire formats to and from it.
"""
from ..jobs import descriptor_key
from .readiness import NOT_READY, device_report, is_ready, ready_device

__all__ = ["NOT_READY", "descriptor_key", "device_report", "is_ready", "ready_device"]
