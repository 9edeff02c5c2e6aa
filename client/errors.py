"""The client's exceptions. Everything it raises on purpose derives from ``VkactError``::

    VkactError
    ├── TransportError               the request did not complete (connection refused, reset, ...)
    │   └── Timeout                  connect, read, write or pool timeout
    ├── ProtocolError                the response does not follow the /v1 wire format
    └── ServerError                  the service answered 4xx/5xx: .status, .message, .field
        ├── BadRequest (400)         malformed frame, encoding or JSON
        ├── NotFound (404)           unknown operator Type or path
        ├── PayloadTooLarge (413)    the body exceeds the service's limit
        ├── InvalidDescriptor (422)  a descriptor breaks a DirectML rule, or the device cannot run it
        ├── ServiceBusy (503)        transient: the queue is full, or the device worker is (re)starting or
        │                            died under the request; .retry_after says when to try again
        └── InternalServerError (5xx) the device or a shader failed (507: the server's /dev/shm is full, so a
                                     shared memory registration was not recorded; nothing changed)

Argument mistakes found before sending (a dtype with no DML_TENSOR_DATA_TYPE, the wrong number of
arrays) are plain ``TypeError``/``ValueError``, as in numpy: they are bugs, not conditions to handle.
"""
from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Optional

import httpx


class VkactError(Exception):
    """Base of every error the client raises about a request."""


class TransportError(VkactError):
    """The request or response did not get through; the httpx exception is ``__cause__``."""


class Timeout(TransportError):
    """One of the client's timeouts expired."""


class ProtocolError(VkactError):
    """The service answered 2xx, but the response could not be decoded (wrong version or a proxy?)."""


class ServerError(VkactError):
    """The service rejected the request or failed: its HTTP status, message and the request field."""

    def __init__(self, status: int, message: str, field: Optional[str] = None) -> None:
        super().__init__(f"{status}: {message}" + (f" [{field}]" if field else ""))
        self.status = status
        self.message = message
        self.field = field


class BadRequest(ServerError):
    """400: the request's frame, encoding or JSON is malformed."""


class NotFound(ServerError):
    """404: unknown operator Type, or a path the service does not serve."""


class PayloadTooLarge(ServerError):
    """413: the body is larger than the service accepts."""


class InvalidDescriptor(ServerError):
    """422: a descriptor breaks a DirectML rule, or asks for more than this device can do."""


class ServiceBusy(ServerError):
    """503, transient: the queue is full, the device worker is starting, or it died under this request
    (it restarts by itself); retry after ``retry_after`` seconds."""

    def __init__(self, status: int, message: str, field: Optional[str] = None, retry_after: Optional[float] = None) -> None:
        super().__init__(status, message, field)
        self.retry_after = retry_after


class InternalServerError(ServerError):
    """500 and other 5xx: the device or a shader failed; the request itself may be fine."""


_BY_STATUS: dict[int, type[ServerError]] = {
    400: BadRequest,
    404: NotFound,
    413: PayloadTooLarge,
    422: InvalidDescriptor,
}


def retry_after_seconds(value: Optional[str]) -> Optional[float]:
    """Retry-After is delay-seconds or an HTTP date (RFC 9110 10.2.3); None when absent or garbled."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from_response(response: httpx.Response) -> ServerError:
    """The exception for a 4xx/5xx response whose body should be ``{"error": message, "field": path}``."""
    status = response.status_code
    message, field = response.reason_phrase or f"HTTP {status}", None
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
        text = response.text.strip()
        message = text[:500] or message  # e.g. a proxy's HTML page: keep it short but visible
    if isinstance(body, dict):
        if "error" in body:
            message = str(body["error"])
            field = body.get("field") if isinstance(body.get("field"), str) else None
        elif "detail" in body:  # FastAPI's own bodies (a route the service did not wrap)
            message = str(body["detail"])
    if status == 503:
        return ServiceBusy(status, message, field, retry_after_seconds(response.headers.get("Retry-After")))
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else ServerError)
    return cls(status, message, field)


def transport_error(exc: httpx.RequestError) -> TransportError:
    cls = Timeout if isinstance(exc, httpx.TimeoutException) else TransportError
    return cls(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
