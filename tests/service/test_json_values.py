"""json_text.json_values: an output's values written straight from the array where numpy holds the type,
the same text as client.codec.encode_data's list (what the answers wrote before), for every type a JSON
answer carries, finite and not."""
from __future__ import annotations

import numpy as np
import pytest

from client.codec import Encoding, encode_data
from client.json_values import BFLOAT16
from service.api.json_text import dumps, json_values

rng = np.random.default_rng(25)


def bits(dtype, n: int) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return rng.integers(0, 256, size=n * width, dtype=np.uint8)  # every bit pattern: subnormals, ±0, NaN, ±inf


CASES = {
    "float16, all": np.arange(1 << 16, dtype=np.uint16).view(np.uint8),
    "float32": bits(np.float32, 200_000),
    "float64": bits(np.float64, 50_000),
    **{np.dtype(t).name: bits(t, 4096) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)},
}
DTYPES = {"float16, all": np.float16, "float32": np.float32, "float64": np.float64}


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_the_text_is_encode_datas(case):
    dtype = np.dtype(DTYPES.get(case, case))
    data = CASES[case]
    values = data.view(dtype)
    pieces = [data] if dtype.kind in "iu" else [values[np.isfinite(values)].view(np.uint8), data[: 64 * dtype.itemsize]]  # finite; mixed
    for piece in pieces:
        assert dumps(json_values(piece, dtype)) == dumps(encode_data(piece, dtype, piece.nbytes, Encoding.JSON))


def test_bfloat16_and_non_finite_values_are_encode_datas_list():
    data = bits(np.uint16, 4096)
    assert json_values(data, BFLOAT16) == encode_data(data, BFLOAT16, data.nbytes, Encoding.JSON)
    nan = np.array([1.5, np.nan, -np.inf], np.float32).view(np.uint8)
    assert json_values(nan, np.dtype(np.float32)) == [1.5, "NaN", "-Infinity"]
