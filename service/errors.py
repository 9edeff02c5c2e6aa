"""The error hierarchy. Each error carries its HTTP status and the request field it is about; the API
maps them to ``{"error": message, "field": path}`` bodies in one handler.

    VkactError (500)
    ├── InvalidRequest (400)         bad input that no descriptor rule covers (frames, encodings)
    │   └── DescriptorError (422)    a descriptor breaks a DirectML rule; also a ValueError for pydantic
    ├── UnknownOperator (404)
    ├── PayloadTooLarge (413)
    ├── UnsupportedOnDevice (422)    valid for DirectML, beyond this device (buffer size, data type)
    ├── Busy (503)                   the queue is full; retry later
    ├── NotReady (503)               the device worker is starting or restarting
    │   └── WorkerLost (503)         the device worker died while running the request; retry
    ├── Timeout (504)                no answer from the device within request_timeout_s
    └── DeviceFailure (500)          the device or a shader failed; never caused by the request's content
"""
from __future__ import annotations


class VkactError(Exception):
    status = 500

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidRequest(VkactError):
    status = 400


class DescriptorError(InvalidRequest, ValueError):
    """Raised inside pydantic validators: pydantic keeps it in the error's ctx, so the field survives."""

    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field)


class UnknownOperator(VkactError):
    status = 404


class PayloadTooLarge(VkactError):
    status = 413


class UnsupportedOnDevice(VkactError):
    status = 422


class Busy(VkactError):
    status = 503


class DeviceFailure(VkactError):
    status = 500


class ShaderCompileError(DeviceFailure):
    """glslang rejected a shader; the message is the compiler's."""


class Timeout(VkactError):
    status = 504


class NotReady(VkactError):
    status = 503


class WorkerLost(NotReady):
    """The device worker process exited under the request (killed, crashed, or stopped for a hung
    device): transient, the worker restarts, so the client retries (503 with Retry-After)."""
