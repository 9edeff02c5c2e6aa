"""vkact's C code, built by scripts/setup.sh (scripts/build-native.sh): h2grpc, gRPC's HTTP/2 on libnghttp2."""
from __future__ import annotations

try:
    from . import _h2grpc as h2grpc
except ImportError as exc:  # pragma: no cover - a checkout that skipped the set-up
    raise ImportError(f"service.native._h2grpc is not built ({exc}): run `make setup` (scripts/build-native.sh)") from None

__all__ = ["h2grpc"]
