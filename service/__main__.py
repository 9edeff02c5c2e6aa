"""``python -m service`` / ``vkact-serve``: start the HTTP service (flags override VKACT_* variables)."""
from __future__ import annotations

import argparse
import logging
import os
import sys

# Before numpy loads (here, in the HTTP processes and in the device workers they spawn): no operator
# path calls BLAS, and an OpenBLAS pool per process would only add threads that spin on 2 cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import uvicorn  # noqa: E402

from .config import Settings  # noqa: E402
from .supervisor import SUPERVISOR_ENV, supervise  # noqa: E402
from .vulkan_probe import gpu_missing, physical_devices  # noqa: E402

NO_GPU = 2  # exit status of a start that VKACT_REQUIRE_GPU refused


def main(argv: list[str] | None = None) -> None:
    defaults = Settings()
    parser = argparse.ArgumentParser(prog="vkact-serve", description=__doc__)
    parser.add_argument("--host", default=defaults.host, help="address to bind (VKACT_HOST)")
    parser.add_argument("--port", type=int, default=defaults.port, help="port (VKACT_PORT)")
    parser.add_argument("--device", default=defaults.device, help="'auto', an index or part of a name (VKACT_DEVICE)")
    parser.add_argument("--grpc-port", type=int, default=defaults.grpc_port, help="gRPC port, 0 for none (VKACT_GRPC_PORT)")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="HTTP processes, each with its own device worker (VKACT_WORKERS)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-supervise", action="store_true", help="run the HTTP server in this process, with no supervisor to restart it")
    args = parser.parse_args(argv)
    # Settings are read from the environment in every HTTP process, so flags travel that way.
    os.environ.update({"VKACT_HOST": args.host, "VKACT_PORT": str(args.port), "VKACT_DEVICE": args.device, "VKACT_WORKERS": str(args.workers)})
    os.environ["VKACT_GRPC_PORT"] = str(args.grpc_port)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The gpu image asks for a GPU: without one (no NVIDIA device given to the container, or the
    # toolkit's graphics capability missing) it stops here with one line, instead of serving from
    # lavapipe unnoticed. The supervisor's children are past this check already.
    if defaults.require_gpu and not os.environ.get(SUPERVISOR_ENV):
        missing = gpu_missing(physical_devices(), args.device)
        if missing:
            print(f"vkact: no GPU Vulkan device, and VKACT_REQUIRE_GPU is set: {missing}. Give the container an NVIDIA GPU "
                  "with the toolkit's graphics capability, or set VKACT_REQUIRE_GPU=0 to serve from the CPU.", file=sys.stderr)
            sys.exit(NO_GPU)
    if not args.no_supervise:  # this process restarts the HTTP server if it dies (service/supervisor.py)
        sys.exit(supervise(sys.argv[1:] if argv is None else argv))
    uvicorn.run(
        "service.api:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        # httptools with read timeouts and a connection bound; the inference requests parsed in C before it
        http="service.http_native:NativeHttpProtocol" if defaults.http_native else "service.http_guard:GuardedHttpToolsProtocol",
        log_level=args.log_level,
        access_log=False,
    )


if __name__ == "__main__":
    main()
