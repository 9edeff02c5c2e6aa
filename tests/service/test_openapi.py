"""/openapi.json is a valid OpenAPI document that describes what the service really takes and answers:
README's example requests validate against its request body schemas, the errors the server sends
validate against its error schemas for their codes, and /docs and /redoc load no asset from elsewhere."""
from __future__ import annotations

import json
import re
import shlex
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from tests.service.test_readme import curl_commands


@pytest.fixture(scope="module")
def spec(server) -> dict[str, Any]:
    with server.client() as http:
        document = http.get("/openapi.json").json()
    validate(document)  # OpenAPI 3.1's own schema, and every $ref resolves
    return document


def schema_validator(spec: dict, schema: dict) -> jsonschema.Draft202012Validator:
    """A validator for one schema of the document, its #/components/... references resolved in it."""
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


def body_schema(spec: dict, path: str) -> dict:
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def error_schema(spec: dict, path: str, method: str, status: int) -> dict:
    return spec["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]


def readme_posts() -> list[tuple[str, dict]]:
    """(the OpenAPI path, the JSON body) of every README curl command that POSTs a body."""
    posts = []
    for command in curl_commands():
        words = shlex.split(command)
        if "-d" in words:
            url = next(w for w in words if w.startswith("http://"))
            path = re.sub(r"^/v2/models/[^/]+/infer$", "/v2/models/{model}/infer", url.split("8000", 1)[1])
            posts.append((path, json.loads(words[words.index("-d") + 1])))
    return posts


def test_every_post_route_declares_its_body_and_no_fastapi_422(spec):
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                schema = json.dumps(response)
                assert "HTTPValidationError" not in schema and "detail" not in schema, (path, method, status)
            if method == "post" and not path.endswith("unregister") and "/repository/models/" not in path:
                assert "requestBody" in operation, path
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_v1_operator_union_is_discriminated_by_type(spec):
    operator = spec["components"]["schemas"]["ExecuteBody"]["properties"]["Operator"]
    assert operator["discriminator"]["propertyName"] == "Type"
    assert "DML_OPERATOR_ACTIVATION_SOFTMAX1" in operator["discriminator"]["mapping"]
    assert len(operator["oneOf"]) == len(operator["discriminator"]["mapping"])


@pytest.mark.parametrize("path,body", readme_posts(), ids=lambda v: v if isinstance(v, str) else "")
def test_readme_requests_validate_against_the_schema(spec, http, path, body):
    schema_validator(spec, body_schema(spec, path)).validate(body)


def test_the_schema_refuses_what_the_service_refuses(spec):
    (_, good), *_ = [(p, b) for p, b in readme_posts() if p == "/v1/execute"]
    v1 = schema_validator(spec, body_schema(spec, "/v1/execute"))
    for broken in ({**good, "Operator": {**good["Operator"], "Type": "DML_OPERATOR_ACTIVATION_NOPE"}},
                   {**good, "Operator": {**good["Operator"], "Threshold": "high"}},
                   {**good, "Inputs": {"InputTensor": {"base64": 3}}},
                   {**good, "Extra": 1}):
        assert not v1.is_valid(broken), broken
    v2 = schema_validator(spec, body_schema(spec, "/v2/models/{model}/infer"))
    assert not v2.is_valid({"inputs": [{"name": "InputTensor", "shape": [-1], "datatype": "FP32"}]})
    register = schema_validator(spec, body_schema(spec, "/v2/systemsharedmemory/region/{name}/register"))
    assert register.is_valid({"key": "/k", "offset": 0, "byte_size": 64})
    assert not register.is_valid({"key": "/k", "byte_size": 0})


def test_errors_sent_match_their_declared_schemas(spec, http):
    cases = [
        ("/v1/execute", "post", http.post("/v1/execute", content=b"{not json")),
        ("/v1/execute", "post", http.post("/v1/execute", json={"Operator": {"Type": "DML_OPERATOR_ACTIVATION_RELU"}, "Inputs": {}})),
        ("/v1/execute", "post", http.post("/v1/execute", content=b"{}", headers={"Content-Encoding": "br"})),
        ("/v2/models/{model}/infer", "post", http.post("/v2/models/relu/infer", json={"inputs": []})),
        ("/v2/models/{model}/infer", "post", http.post("/v2/models/nope/infer", json={"inputs": []})),
        ("/v2/models/{model}", "get", http.get("/v2/models/nope")),
        ("/v2/systemsharedmemory/region/{name}/register", "post", http.post("/v2/systemsharedmemory/region/r/register", content=b"{}")),
        ("/v2/cudasharedmemory/region/{name}/register", "post", http.post("/v2/cudasharedmemory/region/r/register", content=b"{}")),
    ]
    for path, method, response in cases:
        assert response.status_code >= 400, (path, response.text)
        schema_validator(spec, error_schema(spec, path, method, response.status_code)).validate(response.json())


def test_successful_answers_match_their_declared_schemas(spec, http):
    for path, body in readme_posts():
        response = http.post(path.replace("{model}", "shrink"), json=body)
        if response.status_code == 200:
            ok = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
            schema_validator(spec, ok).validate(response.json())
        else:  # README shows a refusal too (a feature level's constraint)
            schema_validator(spec, error_schema(spec, path, "post", response.status_code)).validate(response.json())


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_load_only_local_assets(http, page):
    html = http.get(page)
    assert html.status_code == 200
    assets = re.findall(r"""(?:src|href)=["']([^"']+)""", html.text) + re.findall(r"""url: ?["']([^"']+)""", html.text)
    assert assets and not [a for a in assets if re.match(r"(https?:)?//", a)], assets
    for asset in assets:
        response = http.get(asset)
        assert response.status_code == 200 and len(response.content) > 1000, asset


#: POST routes that answer as Triton does whatever their body: the example shows the request, refused
REFUSED_BY_DESIGN = {
    "/v2/repository/models/{model}/unload": 400,        # the models are built in
    "/v2/cudasharedmemory/region/{name}/register": 400,  # no CUDA memory
    "/v2/trace/setting": 503, "/v2/models/{model}/trace/setting": 503, "/v2/logging": 503,  # not supported
}


def examples_of(spec: dict) -> list[tuple[str, str, str, Any]]:
    """(URL, path, example name, body or None) of every POST route, its path parameters filled from their examples."""
    out = []
    for path, operations in spec["paths"].items():
        if "post" not in operations:
            continue
        operation = operations["post"]
        params = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "path"}
        assert all("example" in p for p in params.values()), (path, params)  # "Try it out" leaves none blank
        url = path.format(**{name: p["example"] for name, p in params.items()})
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            out.append((url, path, "-", None))
            continue
        assert body.get("examples"), f"{path} has a body and no example"
        out += [(url, path, name, example["value"]) for name, example in body["examples"].items()]
    return out


def test_every_post_example_works_as_written(spec, http):
    """What Swagger's "Try it out" sends: each example, as written, answers 2xx (or the refusal a route
    always answers, as Triton's); results are checked against the operator's numpy reference."""
    import numpy as np
    import tritonclient.utils.shared_memory as shm

    from service.api.openapi_examples import REGION_KEY
    from service.operators import parse_operator

    region = shm.create_shared_memory_region("openapi_example", REGION_KEY, 64)  # what the register example names
    try:
        families = set()
        for url, path, name, body in examples_of(spec):
            answer = http.post(url, json=body) if body is not None else http.post(url)
            expected = REFUSED_BY_DESIGN.get(path)
            if expected is not None:
                assert answer.status_code == expected, (url, name, answer.text)
                continue
            assert 200 <= answer.status_code < 300, (url, name, answer.text)
            if path == "/v1/execute" and "Graph" in body:   # a chain: each node's float64 reference in turn
                value = np.array(body["Inputs"]["x"], np.float64)
                for node in body["Graph"]["Nodes"]:
                    op = parse_operator(node["Operator"])
                    value = op.reference(value.reshape(op.inputs[0].Sizes))
                np.testing.assert_allclose(answer.json()["Outputs"]["y"], value.reshape(-1), rtol=1e-5, atol=1e-6)
                assert answer.json()["Compiled"]["Fused"] is True
                families.add("graph")
            elif path == "/v1/execute":
                op = parse_operator(body["Operator"])
                inputs = [np.array(body["Inputs"][f], np.float32).reshape(op.inputs[0].Sizes) for f in op.input_fields]
                got = np.array(answer.json()["Output"], np.float32).reshape(op.output.Sizes)
                np.testing.assert_allclose(got, op.reference(*inputs), rtol=1e-5, atol=1e-6)
                families.add(op.kind)
            elif path.endswith("/infer"):
                x = np.array(body["inputs"][0]["data"], np.float64)
                alpha = float(body["parameters"]["Alpha"])
                celu = np.maximum(x, 0) + np.minimum(0, alpha * (np.exp(x / alpha) - 1))  # CELU's formula, float64
                np.testing.assert_allclose(answer.json()["outputs"][0]["data"], celu, rtol=1e-5, atol=1e-6)
        assert families == {"elementwise", "reduction", "graph"}
    finally:
        http.post("/v2/systemsharedmemory/unregister")
        http.post("/v2/repository/models/celu/load")  # the load example set celu's batching: the service's again
        shm.destroy_shared_memory_region(region)


def test_v1_execute_has_one_example_per_operator_family(spec):
    examples = spec["paths"]["/v1/execute"]["post"]["requestBody"]["content"]["application/json"]["examples"]
    families = {name.split(":")[0] for name in examples}
    assert families == {"no parameters", "scalar parameters", "two inputs", "reduction over the last axis", "reduction over axes", "graph"}
    v1 = schema_validator(spec, body_schema(spec, "/v1/execute"))
    for example in examples.values():
        v1.validate(example["value"])
