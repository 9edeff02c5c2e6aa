"""client.codec's JSON header parsing reads what the json module reads, with orjson or without."""
from __future__ import annotations

import json
import math

import pytest

from client import codec
from client.codec import CodecError


@pytest.mark.parametrize("text", [
    b'{"a": [1, -2.5, 1e-45, 3.4028234663852886e38], "b": "\\u00e9t\\u00e9", "c": {"d": null, "e": true}}',
    b'{"nan": NaN, "inf": Infinity, "ninf": -Infinity}',           # json.dumps writes these tokens
    b'{"big": 123456789012345678901234567890, "huge": 1e400}',      # beyond 64-bit ints, beyond double
    b'{"dup": 1, "dup": 2}',
])
def test_headers_parse_as_the_json_module_parses_them(text: bytes) -> None:
    got, want = codec.parse_header(memoryview(text)), json.loads(text)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)  # NaN == NaN as text
    assert all(isinstance(got[k], type(want[k])) for k in want)  # 1e400: a float marked BeyondFloat64


@pytest.mark.parametrize("text, words", [
    (b'{"a": }', "malformed JSON"), (b"\xff\xfe{}", "malformed JSON"), (b"[1, 2]", "must be an object"),
    (b"[" * 100_000, "malformed JSON"),
])
def test_bad_headers_are_codec_errors(text: bytes, words: str) -> None:
    with pytest.raises(CodecError, match=words):
        codec.parse_header(memoryview(text))


def test_orjson_is_what_the_service_parses_with() -> None:
    """The service installs orjson (pyproject's service extra); the client works without it."""
    assert codec.orjson is not None
    assert math.isnan(codec.parse_header(memoryview(b'{"x": NaN}'))["x"])
