"""JSON text in and out of the service.

Out: the answers of inferences, written by orjson: for tensors sent as JSON, writing the numbers is
most of a request's cost (1,024 FLOAT32 values: ~450 us with the json module).

In: a request's JSON header, read so that no text can cost more than its size allows or fail as
anything but a 4xx: its values are counted before parsing (every value becomes a Python object of
~30-100 bytes, so a 16 MB list of small numbers would make close to a gigabyte), and text that is not
Unicode (a lone surrogate escape, which the json module lets through) is refused, since no answer
could quote it back. Texts longer than ``INLINE_BYTES`` are parsed, and answers as long written, in
threads of their own (``in_json_thread``).
"""
from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import orjson

from client.codec import Encoding, encode_data, parse_header

from ..errors import InvalidRequest, PayloadTooLarge

# Two threads parse and write large JSON texts: at most two are being made into Python objects (or out
# of them) at once, and the event loop competes for the GIL with at most two threads in long C calls
# (orjson, numpy's list conversions), whatever the number of such requests.
_JSON_THREADS = ThreadPoolExecutor(2, thread_name_prefix="vkact-json")
T = TypeVar("T")
_SCAN_CHUNK = 1 << 20
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> bytes:
    """Compact JSON, as json.dumps(value, separators=(",", ":")) writes it for these values: dicts,
    lists, strings, integers and finite floats (tensor data spells non-finite values as strings,
    client.codec.encode_data; orjson would write a NaN float as null), and ``json_values``' arrays."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


_NUMPY_VALUES = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                                                 np.uint8, np.uint16, np.uint32, np.uint64))


def json_values(data: np.ndarray, dtype: np.dtype) -> Any:
    """An output's values (``data``: its packed bytes) as its JSON ``data``, for ``dumps``: the text of
    client.codec.encode_data's list. Where numpy holds the type, the array itself (integers; finite
    floats widened to float64, as tolist widens them: orjson writes a float64 array's elements as it
    writes Python floats, checked on 800,000 random float32 bit patterns), which spares a Python object
    per element; otherwise (BF16, non-finite values written as strings) encode_data's list."""
    if dtype in _NUMPY_VALUES:
        values = data.view(dtype)
        if values.dtype.kind in "iu":
            return values
        if np.isfinite(values).all():
            return values.astype(np.float64)
    return encode_data(data, dtype, data.nbytes, Encoding.JSON)


async def in_json_thread(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` in one of the threads for JSON text."""
    return await asyncio.get_running_loop().run_in_executor(_JSON_THREADS, work, *args)


def value_bound(raw: memoryview) -> int:
    """At least the number of JSON values in ``raw``: every value but the first of a container follows
    a comma, and every container opens with [ or { (commas in strings only raise the bound). A value
    takes a byte at least, so text no longer than a limit needs no scan."""
    count = 1
    for start in range(0, len(raw), _SCAN_CHUNK):
        chunk = bytes(raw[start : start + _SCAN_CHUNK])
        count += chunk.count(b",") + chunk.count(b"[") + chunk.count(b"{")
    return count


def load_header(raw: memoryview, max_values: int, framed: bool = True) -> dict:
    """A request's JSON header (an object); 413 past ``max_values`` values, 400 for text that is not
    JSON, nests too deeply, holds an integer too long to convert or a lone surrogate. ``framed``: the
    request gave its header's length (see client.codec.parse_header)."""
    if len(raw) > max_values and value_bound(raw) > max_values:
        raise PayloadTooLarge(f"the JSON text holds more than {max_values} values (VKACT_MAX_JSON_VALUES); send large tensors as binary data")
    header = parse_header(raw, framed)  # a CodecError (400) for what is not a JSON object
    if _SURROGATE_ESCAPE.search(raw) is not None and _has_lone_surrogate(header):
        raise InvalidRequest("malformed JSON: a \\u escape names a lone surrogate, which is not a Unicode character")
    return header


def check_answer_values(count: int, max_values: int, field: str, instead: str) -> None:
    """An answer of ``count`` values as JSON is bounded as a request's text is (it makes as many objects)."""
    if count > max_values:
        raise PayloadTooLarge(f"the answer would hold {count} values as JSON, more than {max_values} (VKACT_MAX_JSON_VALUES); {instead}", field)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in a parsed JSON value holds a lone surrogate; iterative, so
    no depth exhausts the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
