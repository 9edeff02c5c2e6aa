"""Tensor elements as JSON numbers, exactly, both ways: the one decoder every front-end uses (/v1's JSON
lists, /v2's ``data`` flat or nested, gRPC's typed contents) and the encoder of answers.

A value the type cannot hold is an error naming the field (a 400 in the service), never a wrapped or
clamped element:

- integer types: whole numbers within the type's range. JSON integers are exact at any size (2^63 - 1,
  2^64 - 1, 2^53 + 1). A number written with a fraction or an exponent (``5.0``, ``1e3``) is parsed as
  a float64, so it is taken only where float64 holds every integer (magnitude up to 2^53); beyond, it
  could stand for several integers and is refused (orjson also reads an integer literal past 64 bits as
  a float64: refused too, as out of range either way).
- floating types: a decimal number is rounded to the nearest element (ties to even), as every JSON
  parser and client does; a finite number that rounds past the type's largest finite value (would
  become an infinity) is refused: an infinity is sent as the string "Infinity". NaN, Infinity and
  -Infinity travel as strings (a JSON text has no such numbers). The decimal is read as float64 first
  (the parser's correct rounding), then rounded to the type: for FP32 and FP16 that double rounding
  differs from a direct decimal rounding only for decimals within 2^-29 of a tie; BF16 is rounded from
  float64 directly (round to odd at float32, then to nearest even: exact).
- BF16 (vkact's BFLOAT16, stored as the top 16 bits of a float32): ``BFLOAT16`` is ml_dtypes.bfloat16
  where ml_dtypes is installed, else a two-byte stand-in that only carries the bits.

Booleans, null, numeric strings and ragged nesting are refused. The common case (a flat list of floats
or of small integers) stays one numpy conversion plus a type scan in C.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import Any

import numpy as np


class CodecError(ValueError):
    """Malformed tensor data or frame; ``field`` is the JSON path it concerns."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class BeyondFloat64(float):
    """The infinity a finite JSON number beyond float64's range (1e400) parses to (client.codec)."""


try:  # optional: numpy has no bfloat16
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = np.dtype([("bfloat16", "<u2")])

NONFINITE = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
EXACT_FLOAT_INTEGERS = 2**53  # float64 holds every integer up to this magnitude
_NUMBERS = (int, float)
RAGGED = "nested data must be rectangular (row-major, every row of one length)"

#: The smallest magnitude that rounds to infinity in each floating type: its largest finite value plus
#: half an ulp. Finite JSON numbers at or beyond it are refused.
_OVERFLOW = {
    np.dtype("<f2").str: 65520.0,
    np.dtype("<f4").str: (2 - 2**-24) * 2.0**127,
    BFLOAT16.str: (2 - 2**-8) * 2.0**127,
}


def is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == BFLOAT16


def decode_values(data: Any, dtype: np.dtype, field: str, type_name: str, nested: bool = True) -> np.ndarray:
    """The elements of JSON ``data`` (a list, nested row-major when ``nested``) as a flat array of
    ``dtype``; ``type_name`` is how the caller's protocol names the type (INT8, FP16, ...)."""
    if not isinstance(data, list):
        raise CodecError(f"data must be a list of numbers{', flat or nested' if nested else ''}", field)
    flat = _flatten(data, field) if nested and data and type(data[0]) is list else data
    fast = _plain_numbers(flat)
    if fast is not None:
        if is_floating(dtype):
            return _rounded(fast, flat, dtype, field, type_name)
        if fast.dtype.kind in "iu":
            return _in_range(fast, flat, dtype, field, type_name)
    kinds = set(map(type, flat))
    if not kinds <= {int, float}:
        if nested and list in kinds:
            raise CodecError(RAGGED, field)
        return _odd_values(flat, dtype, field, type_name)
    if is_floating(dtype):
        return _floats(flat, dtype, field, type_name)
    return _integers(flat, float in kinds, dtype, field, type_name)


def _plain_numbers(flat: list) -> np.ndarray | None:
    """The common case at numpy's speed: a list that numpy reads as one int64, uint64 or float64 array
    and that holds no boolean (numpy reads true as 1). None sends the list to the exact, slower checks.
    Booleans can only hide among the elements equal to 0 or 1: only those are looked at, or every
    element's type when there are many. (An infinity here may be a BeyondFloat64: _rounded looks.)"""
    try:
        values = np.asarray(flat)
    except (ValueError, OverflowError, TypeError):
        return None
    if values.dtype.kind not in "iuf" or values.ndim != 1:
        return None
    zero_or_one = (values == 0) | (values == 1)
    if not zero_or_one.any():
        return values
    suspects = np.flatnonzero(zero_or_one)
    if len(suspects) > len(flat) // 4:  # a type scan of the whole list costs less than looking at these one by one
        return values if bool not in set(map(type, flat)) else None
    return None if any(type(flat[i]) is bool for i in suspects.tolist()) else values


def encode_values(values: np.ndarray) -> list:
    """Elements as JSON values: integers exact at any width, floats as the shortest decimal that reads
    back to the same float64 (so to the same element), non-finite values as "NaN", "Infinity", "-Infinity"."""
    if values.dtype == BFLOAT16:
        values = bfloat16_to_float32(values.view("<u2"))
    out = values.tolist()
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return out
    return [v if v - v == 0 else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")) for v in out]


def _flatten(data: list, field: str) -> list:
    """Nested lists as one flat list, checking that every row of a level has one length (C-speed
    scans, one level at a time, so no depth exhausts the stack)."""
    level: list = data
    while level and type(level[0]) is list:
        if set(map(type, level)) != {list}:
            raise CodecError(RAGGED, field)
        if len(set(map(len, level))) != 1:
            raise CodecError(RAGGED, field)
        level = list(chain.from_iterable(level))
    if list in set(map(type, level)):
        raise CodecError(RAGGED, field)
    return level


def _odd_values(flat: list, dtype: np.dtype, field: str, type_name: str) -> np.ndarray:
    """Lists with strings (NaN, Infinity, -Infinity for floating types) or with something that is no number."""
    floating = is_floating(dtype)
    for i, v in enumerate(flat):
        if type(v) in _NUMBERS or (floating and type(v) is str and v in NONFINITE):
            continue
        if type(v) is BeyondFloat64:
            raise CodecError(f"element {i} overflows {type_name}: it is beyond float64's range (send \"Infinity\" for an infinity)", field)
        if type(v) is bool:
            raise CodecError(f"element {i} is {str(v).lower()}: booleans are not numbers of datatype {type_name}", field)
        hint = "" if floating or type(v) is not str or v not in NONFINITE else f" ({type_name} has no NaN or infinity)"
        raise CodecError(f"element {i} is {_short(v)}, not a number of datatype {type_name}{hint}", field)
    return _floats([NONFINITE.get(v, v) if type(v) is str else v for v in flat], dtype, field, type_name)


def _floats(flat: list, dtype: np.dtype, field: str, type_name: str) -> np.ndarray:
    try:
        values = np.array(flat, np.float64)
    except OverflowError:  # a JSON integer beyond float64's range
        i, v = next((i, v) for i, v in enumerate(flat) if type(v) is int and abs(v) >= 2**1024 - 2**970)  # float(v) would round to 2^1024
        raise CodecError(f"element {i} is {_short(v)}, which overflows {type_name}: it is beyond float64's range", field) from None
    return _rounded(values, flat, dtype, field, type_name)


def _rounded(values: np.ndarray, flat: list, dtype: np.dtype, field: str, type_name: str) -> np.ndarray:
    """Numbers rounded to the floating type, refusing finite ones that would round to an infinity."""
    limit = _OVERFLOW.get(dtype.str, math.inf)
    if values.size and not -limit < values.min() <= values.max() < limit:  # NaN, infinities, finite overflow: look closer
        with np.errstate(invalid="ignore"):
            beyond = ~(np.abs(values) < limit)
        for i in np.flatnonzero(beyond & np.isinf(values)).tolist():
            if type(flat[i]) is BeyondFloat64:
                raise CodecError(f"element {i} overflows {type_name}: it is beyond float64's range (send \"Infinity\" for an infinity)", field)
        beyond &= np.isfinite(values)
        if beyond.any():
            i = int(np.flatnonzero(beyond)[0])
            raise CodecError(f"element {i} is {_short(flat[i])}, which overflows {type_name} (it would round to an infinity; "
                             "send \"Infinity\" for one)", field)
    if dtype == BFLOAT16:
        return float64_to_bfloat16(values.astype(np.float64, copy=False)).view(dtype)
    return values.astype(dtype)


def _in_range(values: np.ndarray, flat: list, dtype: np.dtype, field: str, type_name: str) -> np.ndarray:
    """Integers (an int64 or uint64 array: exact) within the integer type's range, as that type."""
    info = np.iinfo(dtype)
    if values.size and (int(values.min()) < info.min or int(values.max()) > info.max):
        i, v = next((i, v) for i, v in enumerate(flat) if not info.min <= v <= info.max)
        raise CodecError(f"element {i} is {_short(v)}, out of range for datatype {type_name} ({info.min}..{info.max})", field)
    return values.astype(dtype)


def _integers(flat: list, has_floats: bool, dtype: np.dtype, field: str, type_name: str) -> np.ndarray:
    """The exact path for integer types: floats among the numbers, or integers that numpy cannot hold
    in one int64 or uint64 array."""
    if has_floats:
        for i, v in enumerate(flat):
            if type(v) is float and not v.is_integer():
                raise CodecError(f"element {i} is {_short(v)}, not a whole number: datatype {type_name} holds whole numbers only", field)
            if type(v) is float and abs(v) > EXACT_FLOAT_INTEGERS:
                raise CodecError(f"element {i} is {_short(v)}, written as a float (a fraction, an exponent, or an integer past 64 "
                                 f"bits), which is exact only up to 2^53: write integers of datatype {type_name} as plain integers", field)
    info = np.iinfo(dtype)
    for i, v in enumerate(flat):  # exact comparisons on the Python numbers
        if not info.min <= v <= info.max:
            raise CodecError(f"element {i} is {_short(v)}, out of range for datatype {type_name} ({info.min}..{info.max})", field)
    return np.array([int(v) for v in flat], dtype)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- bfloat16: the top half of a float32 ------------------------------------------------------------------


def float64_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float64 to bfloat16 bits (uint16), rounded to nearest, ties to even, in one rounding: round to
    odd at float32 (truncate, then set the last bit where anything was cut), which keeps enough bits for
    the second rounding to be exact. NaN stays NaN (quiet, sign kept)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = values.astype(np.float32)
        wide = f32.astype(np.float64)
        bits = f32.view(np.uint32).copy()
        finite = np.isfinite(values)
        too_far = finite & (np.abs(wide) > np.abs(values))  # rounded away from zero: step back one ulp
        bits[too_far] -= 1
        inexact = finite & (wide != values)
        bits[inexact] |= 1
    return float32_bits_to_bfloat16(bits)


def float32_bits_to_bfloat16(bits: np.ndarray) -> np.ndarray:
    """float32 bits (uint32) to bfloat16 bits, round to nearest even; NaN made quiet, its sign kept."""
    bits = bits.astype(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype(np.uint16)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) to float32: exact."""
    return (bits.astype(np.uint32) << 16).view(np.float32)
