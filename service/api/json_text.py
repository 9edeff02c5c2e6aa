"""The JSON text of inference answers, written by orjson: for tensors sent as JSON, writing the
numbers is most of a request's cost (1,024 FLOAT32 values: ~450 us with the json module)."""
from __future__ import annotations

from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """Compact JSON, as json.dumps(value, separators=(",", ":")) writes it for these values: dicts,
    lists, strings, integers and finite floats (tensor data spells non-finite values as strings,
    client.codec.encode_data; orjson would write a NaN float as null)."""
    return orjson.dumps(value)
