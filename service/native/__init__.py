"""vkact's C code, built by scripts/setup.sh (scripts/build-native.sh): h2grpc, gRPC's HTTP/2 on libnghttp2;
h1http, the HTTP/1.1 inference requests (service/http_native.py).

VKACT_NATIVE_DIR names another directory to load the extension from: the sanitizer build
(scripts/build-native.sh --sanitize, run by `make test-asan`), which never replaces the normal one."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import sysconfig


def _load_from(directory: str, module: str):  # noqa: ANN202 - the extension module
    name = f"{__name__}.{module}"
    path = os.path.join(directory, module + sysconfig.get_config_var("EXT_SUFFIX"))
    spec = importlib.util.spec_from_file_location(name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
    if spec is None or not os.path.exists(path):
        raise ImportError(f"VKACT_NATIVE_DIR={directory}: no {os.path.basename(path)} there (scripts/build-native.sh --sanitize)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


if os.environ.get("VKACT_NATIVE_DIR"):
    h2grpc = _load_from(os.environ["VKACT_NATIVE_DIR"], "_h2grpc")
    h1http = _load_from(os.environ["VKACT_NATIVE_DIR"], "_h1http")
else:
    try:
        from . import _h1http as h1http
        from . import _h2grpc as h2grpc
    except ImportError as exc:  # pragma: no cover - a checkout that skipped the set-up
        raise ImportError(f"service.native's extensions are not built ({exc}): run `make setup` (scripts/build-native.sh)") from None

__all__ = ["h1http", "h2grpc"]
