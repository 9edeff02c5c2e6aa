"""``Client`` and ``AsyncClient``, shaped like httpx's: ``_BaseClient`` builds requests and reads
responses without I/O; the two subclasses add only the send step (and sync or async spelling).

The operator methods (``client.shrink(x, bias=0.1)``) come from the generated ``OperatorMethods``
mixin and call ``execute``, so they return an array on ``Client`` and an awaitable on ``AsyncClient``.
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Optional, Union, cast

import httpx
import numpy as np
import numpy.typing as npt

from . import codec
from ._operators import BY_TYPE, OPERATORS, OperatorInfo, OperatorMethods
from .codec import BINARY_CONTENT_TYPE, HEADER_LENGTH, CodecError, Encoding
from .errors import ProtocolError, error_from_response, transport_error
from .graphs import CompiledGraph, GraphBuilder
from .json_values import BFLOAT16
from .tensors import RAW_BFLOAT16, Layout, Tensor, from_array, output_desc

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
EXECUTE, OPERATORS_PATH, DEVICE, LIVE, READY = "/v1/execute", "/v1/operators", "/v1/device", "/health/live", "/health/ready"

#: A descriptor Type ("DML_OPERATOR_ACTIVATION_SHRINK"), a method name ("shrink"), or a descriptor
#: dict holding the Type and scalar fields ({"Type": ..., "Bias": 0.1}).
OperatorSpec = Union[str, Mapping[str, Any]]
TimeoutTypes = Union[float, httpx.Timeout, None]
_ExcType = Optional[type[BaseException]]
# An operator this client version was not generated with still works through execute(), assuming
# DirectML's common shape: one input, one output.
_UNARY = ("InputTensor",), "OutputTensor"


@dataclass(frozen=True)
class _Call:
    """A built /v1/execute request and what reading its response needs."""

    request: httpx.Request
    scalar: bool  # the input was 0-d: DirectML saw shape (1,), the caller gets a 0-d array back
    raw_bits: bool = False  # bfloat16 sent as raw uint16 bits (no ml_dtypes): the output comes back so


def feature_level_name(level: Any) -> str:
    """'5.1', '5_1' or 'DML_FEATURE_LEVEL_5_1' (or an enum with such a value) -> 'DML_FEATURE_LEVEL_5_1'."""
    text = str(getattr(level, "value", level))
    return text if text.startswith("DML_FEATURE_LEVEL_") else "DML_FEATURE_LEVEL_" + text.replace(".", "_")


class _BaseClient:
    _http: Union[httpx.Client, httpx.AsyncClient]

    def __init__(self, encoding: Union[Encoding, str]) -> None:
        self.encoding = Encoding(encoding)
        self._execute: Optional[httpx.URL] = None

    def _execute_url(self) -> httpx.URL:
        """/v1/execute on the base URL, resolved once: httpx parses and merges a relative URL on every
        request, a third of building one."""
        if self._execute is None:
            self._execute = self._http.build_request("POST", EXECUTE).url
        return self._execute

    @property
    def base_url(self) -> httpx.URL:
        return self._http.base_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.base_url)!r}, encoding={self.encoding.value!r})"

    # -- requests ---------------------------------------------------------------------------------

    def _build_execute(
        self,
        operator: OperatorSpec,
        arrays: Sequence[npt.ArrayLike],
        params: Optional[Mapping[str, Any]],
        in_place: bool,
        feature_level: Any,
        encoding: Union[Encoding, str, None],
        output_strides: Optional[Sequence[int]],
        data_type: Optional[str] = None,
    ) -> _Call:
        desc, info = _operator(operator, params)
        inputs, output = (info.inputs, info.output) if info else _UNARY
        if len(arrays) != len(inputs):
            raise TypeError(f"{desc['Type']} takes {len(inputs)} array(s) ({', '.join(inputs)}), got {len(arrays)}")
        clash = [f for f in (*inputs, output) if f in desc]
        if clash and (clash != [output] or output_strides is not None):
            raise ValueError(f"{', '.join(clash)}: tensor descriptors come from the arrays (and output_strides)")
        tensors = [from_array(a, data_type) for a in arrays]
        tensor_descs: dict[str, Any] = {f: t.desc for f, t in zip(inputs, tensors)}
        first = tensors[0].desc
        if output_strides is not None:
            tensor_descs[output] = output_desc(first, tuple(output_strides))
        elif "Strides" in first and not in_place and output not in desc:
            # The service's default output is the input's layout, gaps included; ask for it packed.
            tensor_descs[output] = output_desc(first, None)
        desc = {"Type": desc.pop("Type"), **tensor_descs, **desc}

        enc = Encoding(encoding if encoding is not None else self.encoding)
        body: dict[str, Any] = {
            "Operator": desc,
            "Inputs": {f: codec.encode_data(t.buffer, t.dtype, t.span, enc) for f, t in zip(inputs, tensors)},
            "InPlace": bool(in_place),
            "ResponseEncoding": enc.value,
        }
        if feature_level is not None:
            body["FeatureLevel"] = feature_level_name(feature_level)
        request = self._http.build_request("POST", self._execute_url(), **_content(body, tensors, enc))
        raw_bits = tensors[0].dtype == BFLOAT16 and BFLOAT16.names is not None
        return _Call(request, scalar=all(np.ndim(a) == 0 for a in arrays), raw_bits=raw_bits)

    def _get(self, path: str) -> httpx.Request:
        return self._http.build_request("GET", path)

    def graph(self) -> GraphBuilder:
        """A graph builder (see client.graphs): its operator methods record nodes; ``compile`` gives a
        graph to call on arrays by input name, over this client."""
        return GraphBuilder(self)

    def _build_graph(self, graph: CompiledGraph, arrays: Mapping[str, npt.ArrayLike], encoding: Union[Encoding, str, None]) -> httpx.Request:
        enc = Encoding(encoding if encoding is not None else self.encoding)
        return self._http.build_request("POST", self._execute_url(), **graph.request_content(arrays, enc))

    @staticmethod
    def _read_graph(response: httpx.Response, graph: CompiledGraph) -> dict[str, np.ndarray]:
        if not response.is_success:
            raise error_from_response(response)
        return graph.read_answer(response.content, response.headers.get(HEADER_LENGTH))

    # -- responses --------------------------------------------------------------------------------

    @staticmethod
    def _read_execute(response: httpx.Response, call: _Call) -> np.ndarray:
        if not response.is_success:
            raise error_from_response(response)
        try:
            header, tail = codec.split_frame(response.content, response.headers.get(HEADER_LENGTH))
            desc, data = header["OutputTensor"], header["Output"]
            layout = Layout.of(desc)
            binary = codec.binary_slices([("Output", data)], tail).get("Output")
            result = layout.to_array(codec.decode_data(data, layout.dtype, layout.total, layout.span, "Output", binary))
        except (CodecError, KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed {EXECUTE} response: {exc}") from exc
        if call.raw_bits:
            result = result.view(RAW_BFLOAT16)
        # copy(): a reshaped view would not own its memory, and callers may rely on that
        return result.reshape(()).copy() if call.scalar and result.shape == (1,) else result

    @staticmethod
    def _read_json(response: httpx.Response) -> Any:
        if not response.is_success:
            raise error_from_response(response)
        try:
            return response.json()
        except ValueError as exc:
            raise ProtocolError(f"{response.request.url.path}: the response is not JSON ({exc})") from exc

    @staticmethod
    def _read_health(response: httpx.Response) -> bool:
        # 503 is the probe's normal "not (yet) ready" answer, not an error of the request.
        if response.status_code == 503:
            return False
        if not response.is_success:
            raise error_from_response(response)
        return True


def _operator(operator: OperatorSpec, params: Optional[Mapping[str, Any]]) -> tuple[dict[str, Any], Optional[OperatorInfo]]:
    """(descriptor without tensors, what the generated table knows about its Type)."""
    if isinstance(operator, Mapping):
        desc = dict(operator)
        if not isinstance(desc.get("Type"), str):
            raise ValueError("an operator dict needs its 'Type', e.g. 'DML_OPERATOR_ACTIVATION_SHRINK'")
    elif isinstance(operator, str):
        desc = {"Type": OPERATORS[operator].type if operator in OPERATORS else operator}
    else:
        raise TypeError(f"operator must be a Type name or a descriptor dict, got {type(operator).__name__}")
    desc.update(params or {})
    # json cannot write numpy scalars (bias=np.float32(0.1)); their Python value is exact.
    desc = {k: v.item() if isinstance(v, np.generic) else v for k, v in desc.items()}
    return desc, BY_TYPE.get(desc["Type"])


def _content(body: dict[str, Any], tensors: Sequence[Tensor], encoding: Encoding) -> dict[str, Any]:
    """build_request's content and headers for a body: a binary frame, or plain JSON."""
    if encoding is Encoding.BINARY:
        parts, header_length = codec.encode_frame(body, [t.buffer for t in tensors])
        headers = {"Content-Type": BINARY_CONTENT_TYPE, HEADER_LENGTH: str(header_length)}
        return {"content": b"".join(cast("list[bytes]", parts)), "headers": headers}  # arrays are buffers too
    # Tensor data has no NaN tokens (encode_data spells them as strings); a NaN parameter is written as
    # the binary frame's header writes it, so the service rejects it with the same 422 either way.
    content = json.dumps(body, separators=(",", ":")).encode()
    return {"content": content, "headers": {"Content-Type": "application/json"}}


class Client(_BaseClient, OperatorMethods[np.ndarray]):
    """A blocking client; one connection pool per instance, so reuse it (``with Client() as c: ...``).

    Args:
        base_url: where the service listens.
        timeout: seconds (or an ``httpx.Timeout``) for connect, read, write and pool waits.
        encoding: how tensors travel by default: "binary" (a frame: JSON header + raw bytes),
            "base64" or "json" (lists of numbers).
        transport: an httpx transport, e.g. ``httpx.MockTransport`` in tests.
        headers: sent with every request.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: TimeoutTypes = 60.0,
        encoding: Union[Encoding, str] = Encoding.BINARY,
        transport: Optional[httpx.BaseTransport] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(encoding)
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport, headers=headers)

    def execute(
        self,
        operator: OperatorSpec,
        *arrays: npt.ArrayLike,
        params: Optional[Mapping[str, Any]] = None,
        in_place: bool = False,
        feature_level: Any = None,
        encoding: Union[Encoding, str, None] = None,
        output_strides: Optional[Sequence[int]] = None,
        data_type: Optional[str] = None,
    ) -> np.ndarray:
        """Run one operator on ``arrays`` (one per input tensor) and return its output.

        Args:
            operator: a Type ("DML_OPERATOR_ACTIVATION_CELU"), a method name ("celu"), or a
                descriptor dict with the Type and scalar fields.
            params: scalar fields by their DirectML names ({"Alpha": 2.0}); omitted ones take
                DirectML's defaults on the service.
            in_place: ask the service to write the output over the first input's buffer.
            feature_level: apply DirectML's rules of that level ("5.1", "DML_FEATURE_LEVEL_5_1").
            encoding: this request's encoding instead of the client's; the response uses the same.
            output_strides: the output's element strides (default: the service's choice, packed).
            data_type: the inputs' DataType where their numpy dtype cannot say it: "bfloat16" (or
                "VKACT_TENSOR_DATA_TYPE_BFLOAT16") for arrays of raw bfloat16 bits as uint16, which
                is how bfloat16 travels without ml_dtypes (an ml_dtypes.bfloat16 array needs none);
                the output then comes back as uint16 bits too.

        Returns:
            The output as a new C-contiguous array of the input's dtype (0-d for a 0-d input).

        Raises:
            ServerError subclasses for 4xx/5xx answers, TransportError, ProtocolError.
        """
        call = self._build_execute(operator, arrays, params, in_place, feature_level, encoding, output_strides, data_type)
        return self._read_execute(self._send(call.request), call)

    def _run_graph(self, graph: CompiledGraph, arrays: Mapping[str, npt.ArrayLike], encoding: Union[Encoding, str, None]) -> dict[str, np.ndarray]:
        return self._read_graph(self._send(self._build_graph(graph, arrays, encoding)), graph)

    def operators(self) -> Any:
        """The service's operator catalog (GET /v1/operators)."""
        return self._read_json(self._send(self._get(OPERATORS_PATH)))

    def device(self) -> Any:
        """The Vulkan device the service runs on and its limits (GET /v1/device)."""
        return self._read_json(self._send(self._get(DEVICE)))

    def live(self) -> bool:
        """True if the service process answers (GET /health/live); False on 503."""
        return self._read_health(self._send(self._get(LIVE)))

    def ready(self) -> bool:
        """True if the service can run operators now (GET /health/ready); False on 503."""
        return self._read_health(self._send(self._get(READY)))

    def _send(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(self._http, httpx.Client)
        try:
            return self._http.send(request)
        except httpx.RequestError as exc:
            raise transport_error(exc) from exc

    def close(self) -> None:
        self._http.close()  # type: ignore[union-attr]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: _ExcType, exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()


class AsyncClient(_BaseClient, OperatorMethods[Awaitable[np.ndarray]]):
    """The asyncio (anyio) twin of ``Client``: same arguments, every request method is awaited and
    ``aclose``/``async with`` replace ``close``/``with``."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        *,
        timeout: TimeoutTypes = 60.0,
        encoding: Union[Encoding, str] = Encoding.BINARY,
        transport: Optional[httpx.AsyncBaseTransport] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(encoding)
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout, transport=transport, headers=headers)

    async def execute(
        self,
        operator: OperatorSpec,
        *arrays: npt.ArrayLike,
        params: Optional[Mapping[str, Any]] = None,
        in_place: bool = False,
        feature_level: Any = None,
        encoding: Union[Encoding, str, None] = None,
        output_strides: Optional[Sequence[int]] = None,
        data_type: Optional[str] = None,
    ) -> np.ndarray:
        """As ``Client.execute``."""
        call = self._build_execute(operator, arrays, params, in_place, feature_level, encoding, output_strides, data_type)
        return self._read_execute(await self._send(call.request), call)

    async def _run_graph(self, graph: CompiledGraph, arrays: Mapping[str, npt.ArrayLike], encoding: Union[Encoding, str, None]) -> dict[str, np.ndarray]:
        return self._read_graph(await self._send(self._build_graph(graph, arrays, encoding)), graph)

    async def operators(self) -> Any:
        return self._read_json(await self._send(self._get(OPERATORS_PATH)))

    async def device(self) -> Any:
        return self._read_json(await self._send(self._get(DEVICE)))

    async def live(self) -> bool:
        return self._read_health(await self._send(self._get(LIVE)))

    async def ready(self) -> bool:
        return self._read_health(await self._send(self._get(READY)))

    async def _send(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(self._http, httpx.AsyncClient)
        try:
            return await self._http.send(request)
        except httpx.RequestError as exc:
            raise transport_error(exc) from exc

    async def aclose(self) -> None:
        await self._http.aclose()  # type: ignore[union-attr]

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: _ExcType, exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        await self.aclose()
