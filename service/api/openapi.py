"""/openapi.json as the service really answers, and /docs, /redoc from local assets.

The POST routes read their bodies themselves (binary frames, bodies sent without a JSON Content-Type,
the hot routes ahead of FastAPI), so FastAPI sees no body parameter to describe. This module adds, once
per process when the document is first asked for (nothing on the request path): each POST body as the
pydantic models that validate it, the responses in their real shapes, and the errors as
service/api/errors.py writes them (``{"error", "field"}`` on /v1, ``{"error"}`` on /v2) with the codes
they come with, in place of FastAPI's 422 ``{"detail"}``, which the service never sends.

Each POST route carries examples that work as written, and each path parameter a value
(openapi_examples), so Swagger's "Try it out" succeeds out of the box.

Swagger UI and ReDoc come from the fastapi-offline wheel's static files, so /docs works offline.
"""
from __future__ import annotations

from importlib.resources import files
from typing import Annotated, Any, Literal, Optional, Union

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH

from ..descriptors.graph import GraphDesc
from ..descriptors.tensor import TensorDesc
from ..operators import OperatorDescriptor
from .openapi_examples import PATH_PARAMETERS
from .openapi_examples import bodies as example_bodies
from .v1.graphs import ExecuteGraphRequest
from .v1.routes import ExecuteRequest
from .v2.codec import InferenceRequest
from .v2.shm import RegisterRequest

ASSETS = "/docs-assets"

# -- the models the document names (requests are the ones the routes validate with) -------------------

NonFinite = Literal["NaN", "Infinity", "-Infinity"]


class Base64Data(BaseModel):
    """A tensor's buffer bytes, base64."""

    model_config = ConfigDict(extra="forbid")
    base64: str


class BinaryData(BaseModel):
    """A tensor's buffer bytes after the JSON header (needs Inference-Header-Content-Length)."""

    model_config = ConfigDict(extra="forbid")
    binary_data_size: Annotated[int, Field(ge=0)]


TensorData = Union[list[Union[float, NonFinite]], Base64Data, BinaryData]


class ExecuteBody(ExecuteRequest):
    """POST /v1/execute: ExecuteRequest, whose Operator is validated by the operator union (by Type)."""

    Operator: OperatorDescriptor  # type: ignore[assignment]
    Inputs: dict[str, TensorData]  # type: ignore[assignment]


class ExecuteResponse(BaseModel):
    Operator: str = Field(description="the operator's Type")
    OutputTensor: TensorDesc
    Output: TensorData


class ExecuteGraphBody(ExecuteGraphRequest):
    """POST /v1/execute with a graph: ExecuteGraphRequest, whose Graph is a DML_GRAPH_DESC."""

    Graph: GraphDesc  # type: ignore[assignment]
    Inputs: dict[str, TensorData] = Field(description="by the input edges' names")  # type: ignore[assignment]


class GraphCompiled(BaseModel):
    Fused: bool = Field(description="false when some elementwise node runs with its own kernel (Notes say why)")
    Dispatches: int = Field(description="dispatches of the compiled graph, in one command buffer")
    Nodes: int
    Notes: list[str] = Field(description="why parts of the graph run node by node")


class ExecuteGraphResponse(BaseModel):
    Compiled: GraphCompiled
    OutputTensors: dict[str, TensorDesc] = Field(description="by the output edges' names")
    Outputs: dict[str, TensorData] = Field(description="by the output edges' names, in graph output order (binary bytes follow in it)")


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: Optional[dict[str, Any]] = Field(None, description="binary_data_size for a binary output; "
                                                 "absent for an output written to shared memory (as Triton)")
    data: Optional[list[Union[float, NonFinite]]] = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: Optional[str] = None
    outputs: list[ResponseOutput]


class RepositoryIndexRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    ready: bool = Field(False, description="list only the models that are ready")


class CudaRegisterRequest(BaseModel):
    """$cuda_shared_memory_register_request: always refused (400), vkact has no CUDA memory."""

    raw_handle: dict[str, str]
    device_id: int
    byte_size: int


class V1Error(BaseModel):
    error: str
    field: Optional[str] = Field(description="the JSON path (or header) the error concerns")


class V2Error(BaseModel):
    """The Open Inference Protocol's error body (the field path is in the message)."""

    error: str


_MODELS: list[type[BaseModel]] = [ExecuteBody, ExecuteResponse, ExecuteGraphBody, ExecuteGraphResponse, InferenceRequest, InferenceResponse, RegisterRequest,
                                  CudaRegisterRequest, RepositoryIndexRequest, V1Error, V2Error]

# -- which route takes which body and answers which errors -----------------------------------------------

_ERROR_TEXT = {400: "bad input", 404: "unknown model, version or region", 413: "body too large",
               415: "unsupported Content-Encoding", 422: "a descriptor that breaks DirectML's rules",
               500: "device failure", 503: "not ready, or the queue is full (Retry-After)",
               504: "the device did not answer in time"}
_INFER_ERRORS = (400, 404, 413, 415, 500, 503, 504)
_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/execute"): (400, 413, 415, 422, 500, 503, 504),
    ("post", "/v2/models/{model}/infer"): _INFER_ERRORS,
    ("post", "/v2/models/{model}/versions/{version}/infer"): _INFER_ERRORS,
    ("post", "/v2/systemsharedmemory/region/{name}/register"): (400,),
    ("post", "/v2/cudasharedmemory/region/{name}/register"): (400,),
    ("post", "/v2/repository/index"): (400,),
    ("post", "/v2/repository/models/{model}/load"): (400, 404, 413, 503),
    ("post", "/v2/repository/models/{model}/unload"): (400, 404),
    ("get", "/v1/device"): (503,),
}

_BODIES: dict[str, tuple[str | tuple[str, ...], str]] = {  # path: (component, or one of several; description)
    "/v1/execute": (("ExecuteBody", "ExecuteGraphBody"), "JSON, or a binary frame: the JSON header, then each binary input's bytes; "
                    "an Operator, or a Graph (DML_GRAPH_DESC) whose Inputs and Outputs are named by its edges"),
    "/v2/models/{model}/infer": ("InferenceRequest", "JSON, a binary frame, or (header 0) one input's raw bytes"),
    "/v2/models/{model}/versions/{version}/infer": ("InferenceRequest", "as .../infer"),
    "/v2/systemsharedmemory/region/{name}/register": ("RegisterRequest", "a region of a POSIX shared memory object"),
    "/v2/cudasharedmemory/region/{name}/register": ("CudaRegisterRequest", "refused: vkact has no CUDA memory"),
    "/v2/repository/index": ("RepositoryIndexRequest", "optional: an empty body lists every model"),
}

_RESPONSES: dict[str, str | tuple[str, ...]] = {"/v1/execute": ("ExecuteResponse", "ExecuteGraphResponse"), "/v2/models/{model}/infer": "InferenceResponse",
              "/v2/models/{model}/versions/{version}/infer": "InferenceResponse"}

_FRAME = {"schema": {"type": "string", "format": "binary",
                     "description": f"the JSON header ({HEADER_LENGTH} bytes, given in that header), then the binary tensors"}}


def _ref(name: str | tuple[str, ...]) -> dict[str, Any]:
    if isinstance(name, tuple):
        return {"oneOf": [_ref(n) for n in name]}
    return {"$ref": f"#/components/schemas/{name}"}


def _error_schema(path: str) -> str:
    return "V2Error" if path == "/v2" or path.startswith("/v2/") else "V1Error"


def build(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    _, defs = models_json_schema([(m, "validation") for m in _MODELS], ref_template="#/components/schemas/{model}")
    schemas = {**defs["$defs"]}
    examples = example_bodies()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # FastAPI's {"detail"}: never sent
            if method == "post" and path in _BODIES:
                component, description = _BODIES[path]
                content: dict[str, Any] = {"application/json": {"schema": _ref(component)}}
                if path in _RESPONSES:
                    content[BINARY_CONTENT_TYPE] = _FRAME
                operation["requestBody"] = {"required": path != "/v2/repository/index", "description": description, "content": content}
            if path in _RESPONSES:
                ok = responses.setdefault("200", {"description": "Successful Response"})
                ok["content"] = {"application/json": {"schema": _ref(_RESPONSES[path])}, BINARY_CONTENT_TYPE: _FRAME}
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in PATH_PARAMETERS:
                    parameter["example"] = PATH_PARAMETERS[parameter["name"]]
            if method == "post" and path in examples:
                body = operation.setdefault("requestBody", {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}})
                body["content"]["application/json"]["examples"] = examples[path]
            codes = _ERRORS.get((method, path), (404,) if "{" in path else ())
            for code in codes:
                responses[str(code)] = {"description": _ERROR_TEXT[code],
                                        "content": {"application/json": {"schema": _ref(_error_schema(path))}}}
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    doc.setdefault("components", {})["schemas"] = dict(sorted(schemas.items()))
    return doc


def install(app: FastAPI) -> None:
    """The document, built on first use, and the offline /docs and /redoc (create the app with
    docs_url=None, redoc_url=None)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
                              redoc_js_url=f"{ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{ASSETS}/favicon.png",
                              with_google_fonts=False)
