"""The fixed limits, in one place: the bounds vkact keeps without a setting (settings are in config.py).
README's "Limits and failure behaviour" lists those a client can meet ("none (N)"); the others bound the
memory of caches and queues. Each module that applies one imports it from here."""
from __future__ import annotations

# -- what a client can meet ------------------------------------------------------------------------
CONTROL_BODY_BYTES = 1 << 16  # the bodies of control requests (repository, shared memory) are a few bytes
#: A graph model's config (its DML_GRAPH_DESC as JSON text) and the body of a load that carries it: a
#: graph of VKACT_MAX_GRAPH_NODES' default 64 nodes, escaped inside the body's JSON, is ~40 KiB.
GRAPH_CONFIG_BYTES = 1 << 20
SHM_MAX_NAME = 256  # characters of a region name: bounds the registry (every registration rewrites it whole)
STREAM_IN_FLIGHT = 128  # requests of one ModelStreamInfer running at once; beyond, each is answered with an error
GRPC_MAX_STREAMS = 128  # gRPC streams open on one connection (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS)
#: grpc-message's length before percent-encoding: an error that echoes the client's input (a 70,000-byte
#: service name) is elided to this, so its trailer fits grpc-core's 8-16 KiB metadata limit (h2grpc
#: cuts any grpc-message at 4,096 bytes besides).
MAX_STATUS_MESSAGE = 1024

# -- request handling in the HTTP process ----------------------------------------------------------
#: A body or message that arrives whole and no larger is not charged: the lock's round trips cost ~2% of
#: a small request in the HTTP process, and such bytes are bounded apart (a request at a time per HTTP
#: connection, VKACT_MAX_CONNECTIONS gRPC calls: 2 x 512 x 64 KiB, 64 MiB at the default).
UNCHARGED_BYTES = 1 << 16
#: The HTTP/1.1 requests h1http takes (service/http_native.py): a body of at most this many bytes (uvicorn's
#: read buffer per connection before it pauses reading, so a connection holds no more unread bytes than
#: under httptools) and a head of at most this many; larger ones go to httptools, within MAX_HTTP_HEAD.
NATIVE_HTTP_BODY = 1 << 16
NATIVE_HTTP_HEAD = 16384
#: A request's head (request line and headers) past this many bytes is a 431 and the connection is closed
#: (http_guard): httptools has no bound of its own, and one request's 1,000 headers of 1 MiB grew the HTTP
#: process by 850 MiB. Counted from the read after the head's first; Go's net/http allows 1 MiB, nginx 32 KiB.
MAX_HTTP_HEAD = 1 << 16
INLINE_BYTES = 1 << 18  # JSON text up to this long is parsed on the event loop: a few ms at most
HEADER_CACHE_ENTRIES = 512  # distinct headers kept by each front-end's header cache, least recently used out
MAX_HEADER_BYTES = 8192  # longer headers are parsed every time

# -- the device worker -----------------------------------------------------------------------------
BATCH_BYTES = 1 << 20  # inputs up to this size may be batched (larger ones gain nothing from it)
IN_FLIGHT = 2          # jobs handed to the worker at once: one running, one ready to start
TEMPLATES = 256        # job templates (see jobs.TemplateIds) each side keeps
OPS_CACHED = 1024      # descriptors the worker keeps unpickled, by their bytes (their canonical keys)
GRAPHS_CACHED = 64     # graph plans the worker keeps unpickled, by their bytes
#: Keyed executions keep their plan and a recorded command buffer; this many, least recently used out.
MAX_PLANS = 256
#: Graph programs keep their buffers, pipelines and command buffer (engine_graph.GraphRun); this many.
MAX_GRAPH_RUNS = 16
#: ... and their pipelines this many at most, all runs together (least recently used runs out): on lavapipe
#: a graph's pipeline holds about 8 MB of the worker's memory (Mesa 22.3: 6 runs of 22-34 dispatches took
#: the process from 124 to 1,432 MB), kept by the allocator when the run goes and reused by the next. A
#: client streaming long graphs of new shapes took the worker to 4.5 GB with runs bounded by count alone.
MAX_GRAPH_PIPELINES = 128
MAX_PROGRAMS = 128   # compiled graph programs kept (least recently used out)

# Nodes one generated shader holds at most; a longer chain runs as several fused steps (one memory pass
# more per MAX_FUSED_NODES nodes). Measured on SwiftShader (Subzero; 2 vCPUs), building the pipeline of a
# LINEAR/SOFTSIGN chain: 32 nodes 0.2 s, 48 nodes 17.5 s, 64 nodes beyond 100 s (past the request timeout,
# so the worker was restarted); lavapipe builds 64 in well under a second. A GPU's compiler is unmeasured:
# the cap costs it at most one extra pass per 32 nodes.
MAX_FUSED_NODES = 32
