"""client.json_values: JSON numbers to tensor elements exactly (or a CodecError), and back.

Oracles: Python's exact integers for the integer types, and for the floating types a rounding written
here from exact rationals (fractions.Fraction), independent of numpy's casts and of the bit tricks the
decoder uses for BF16 (ml_dtypes is no oracle from float64: it rounds through float32 first, twice).
"""
from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import orjson
import pytest

from client import codec
from client.codec import CodecError
from client.json_values import BFLOAT16, decode_values, encode_values, float32_bits_to_bfloat16, float64_to_bfloat16

INTEGERS = [np.dtype(t) for t in ("i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8")]


def decode(values, dtype, nested=True):
    return decode_values(values, np.dtype(dtype), "inputs[0].data", "T", nested)


def through_text(text: bytes, dtype, nested=True):
    """As the service reads it: the JSON text parsed (orjson, or the json module for what orjson refuses)."""
    return decode(codec.parse_header(memoryview(b'{"d": ' + text + b"}"))["d"], dtype, nested)


# -- the rounding oracle ----------------------------------------------------------------------------------


def nearest(x: float, precision: int, emin: int, emax: int) -> float:
    """``x`` rounded to the binary format with ``precision`` significand bits and normal exponents
    emin..emax (subnormals below), to nearest, ties to even; inf past the largest finite value + half ulp."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    exact = Fraction(x)
    sign, exact = (-1 if exact < 0 else 1), abs(exact)
    exponent = max(math.floor(math.log2(exact)), emin)
    while Fraction(2) ** exponent > exact and exponent > emin:  # log2 of a Fraction may be off by one
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= exact:
        exponent += 1
    ulp = Fraction(2) ** (max(exponent, emin) - precision + 1)
    q, r = divmod(exact, ulp)
    if r > ulp / 2 or (r == ulp / 2 and q % 2 == 1):
        q += 1
    value = q * ulp
    largest = (2 - Fraction(2) ** (1 - precision)) * Fraction(2) ** emax
    if value > largest:
        return sign * math.inf
    return sign * float(value)


FORMATS = {"<f2": (11, -14, 15), "<f4": (24, -126, 127), "bf16": (8, -126, 127)}


def as_float64(values: np.ndarray) -> np.ndarray:
    if values.dtype == BFLOAT16:
        return (values.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


EDGES = [
    0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 65504.0, 65519.99, -65519.0, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 3 * 2.0**-26,
    5.960464477539063e-08, 6.1e-05, 3.4028234663852886e38, 3.4028235677973366e38, -3.4028235e38, 1.1754943508222875e-38,
    1.4e-45, 7e-46, 2.0**-149 / 2, 2.0**-149 * 0.75, 1e-300, 5e-324, 2.0**-133, 2.0**-134, 3 * 2.0**-135,
    1 + 2.0**-8, 1 + 2.0**-8 + 2.0**-40, 1 + 3 * 2.0**-8, 1 + 2.0**-24, 1 + 2.0**-24 + 2.0**-50, 3.3895313892515355e38, 3.39e38,
    1.7976931348623157e308, -1e308, 123456.789, 2.0**53 + 2,
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_floats_round_to_nearest_even_as_the_rational_oracle_does(fmt):
    dtype = BFLOAT16 if fmt == "bf16" else np.dtype(fmt)
    rng = np.random.default_rng(17)
    samples = EDGES + list(rng.standard_normal(300) * 10.0 ** rng.integers(-45, 39, 300)) + list(
        np.frombuffer(rng.integers(0, 2**63, 300, dtype=np.uint64).tobytes(), np.float64))
    samples = [float(x) for x in samples if math.isfinite(x)]
    want = [nearest(x, *FORMATS[fmt]) for x in samples]
    fits = [x for x, w in zip(samples, want) if not math.isinf(w)]
    got = as_float64(decode(fits, dtype))
    expected = [w for w in want if not math.isinf(w)]
    assert [struct.pack("<d", g) for g in got] == [struct.pack("<d", e) for e in expected]  # -0.0 kept too
    for x, w in zip(samples, want):
        if math.isinf(w):  # a finite number that would round to an infinity: refused
            with pytest.raises(CodecError, match="overflows T"):
                decode([x], dtype)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nonfinite_strings_and_their_signs(fmt):
    dtype = BFLOAT16 if fmt == "bf16" else np.dtype(fmt)
    got = as_float64(decode(["NaN", "Infinity", "-Infinity", -0.0, 1], dtype))
    assert math.isnan(got[0]) and got[1] == math.inf and got[2] == -math.inf
    assert math.copysign(1, got[3]) == -1 and got[4] == 1
    assert encode_values(decode(["NaN", "Infinity", "-Infinity", -0.0], dtype)) == ["NaN", "Infinity", "-Infinity", -0.0]


def test_bfloat16_from_float64_is_one_rounding_not_two():
    """1 + 2^-8 + 2^-40 lies just above a tie between bfloat16 neighbours: rounding it to float32 first
    lands on the tie, which then goes to even (1.0); one rounding gives 1 + 2^-7."""
    bits = float64_to_bfloat16(np.array([1 + 2.0**-8 + 2.0**-40, -(1 + 2.0**-8 + 2.0**-40), 1 + 2.0**-8]))
    assert bits.tolist() == [0x3F81, 0xBF81, 0x3F80]


def test_bfloat16_nan_stays_a_quiet_nan_with_its_sign():
    signalling = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F810000], np.uint32)
    bits = float32_bits_to_bfloat16(signalling)
    assert all((b & 0x7F80) == 0x7F80 and (b & 0x0040) for b in bits.tolist())  # NaN, quiet
    assert [b >> 15 for b in bits.tolist()] == [0, 1, 0, 0]
    nan64 = float64_to_bfloat16(np.array([math.nan, -math.nan]))
    assert [(b & 0x7FC0) == 0x7FC0 for b in nan64.tolist()] == [True, True]


def test_bfloat16_from_float32_bits_agrees_with_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    bits = np.concatenate([rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x80008000, 0x0000FFFF], np.uint32)])
    finite = bits[(bits & 0x7F800000) != 0x7F800000]
    want = finite.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(float32_bits_to_bfloat16(finite), want)


# -- integers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integers_are_exact_to_the_ends_of_their_range(dtype):
    info = np.iinfo(dtype)
    values = [info.min, info.max, 0, 1, -1 if info.min else 2]
    got = decode(values, dtype)
    assert got.dtype == dtype and [int(v) for v in got] == values
    assert encode_values(got) == values
    for outside in (info.min - 1, info.max + 1):
        with pytest.raises(CodecError, match=rf"element 1 is {outside}, out of range for datatype T \({info.min}\.\.{info.max}\)") as err:
            decode([0, outside, 1], dtype)
        assert err.value.field == "inputs[0].data"


@pytest.mark.parametrize("text, dtype, want", [
    (b"[9223372036854775807, -9223372036854775808, 9007199254740993]", "<i8", [2**63 - 1, -(2**63), 2**53 + 1]),
    (b"[18446744073709551615, 9007199254740993, 0]", "<u8", [2**64 - 1, 2**53 + 1, 0]),
    (b"[[18446744073709551615], [1]]", "<u8", [2**64 - 1, 1]),
    (b"[5.0, 1e3, -9007199254740992.0]", "<i8", [5, 1000, -(2**53)]),
])
def test_64_bit_integers_round_trip_exactly_through_json_text(text, dtype, want):
    got = through_text(text, dtype)
    assert got.dtype == np.dtype(dtype) and [int(v) for v in got] == want
    assert orjson.loads(orjson.dumps(encode_values(got))) == want  # the answer's text, read back exactly


@pytest.mark.parametrize("text, dtype, words", [
    (b"[9223372036854775808]", "<i8", "out of range"),
    (b"[-9223372036854775809]", "<i8", "written as a float"),  # orjson reads it as float64 -2^63: not taken as -2^63
    (b"[18446744073709551616]", "<u8", "written as a float"),
    (b"[123456789012345678901234567890]", "<u8", "written as a float"),  # past 64 bits: orjson reads a float64
    (b"[-1, 18446744073709551615]", "<u8", "element 0 is -1, out of range"),
    (b"[-1, 18446744073709551615]", "<i8", "element 1 is 18446744073709551615, out of range"),
    (b"[9007199254740994.0]", "<i8", r"exact only up to 2\^53"),
    (b"[300, 1.5, -129, 5]", "i1", "element 1 is 1.5, not a whole number"),
    (b"[300, 1, -129, 5]", "i1", "element 0 is 300, out of range for datatype T"),
    (b'[1, "NaN"]', "<i4", "T has no NaN or infinity"),
    (b"[1, true]", "<i4", "booleans are not numbers"),
    (b"[1, null]", "<u2", "None, not a number"),
    (b'[1, "2"]', "<u2", "'2', not a number"),
])
def test_integers_the_type_cannot_hold_are_refused(text, dtype, words):
    with pytest.raises(CodecError, match=words):
        through_text(text, dtype)


# -- floats beyond their types ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, dtype", [
    (b"[1e400]", "<f8"), (b"[-1e400]", "<f4"), (b"[1e39]", "<f4"), (b"[70000]", "<f2"), (b"[65520]", "<f2"),
    (b"[3.4e38, 3.4028235677973366e38]", "bf16"), (b"[1" + b"0" * 400 + b"]", "<f8"),
])
def test_finite_numbers_that_overflow_the_type_are_refused(text, dtype):
    with pytest.raises(CodecError, match="overflows T"):
        through_text(text, BFLOAT16 if dtype == "bf16" else dtype)


def test_largest_finite_values_and_the_numbers_that_round_to_them_are_taken():
    assert through_text(b"[65519, -65504]", "<f2").tolist() == [65504, -65504]
    assert through_text(b"[3.4028235677973362e38]", "<f4")[0] == np.finfo(np.float32).max  # just below the tie
    assert through_text(b"[1.7976931348623157e308]", "<f8")[0] == np.finfo(np.float64).max


# -- shapes -----------------------------------------------------------------------------------------------


def test_nested_data_is_row_major_and_must_be_rectangular():
    assert decode([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], "<i4").tolist() == list(range(1, 9))
    deep: list = [2.5]
    for _ in range(500):
        deep = [deep]
    assert decode(deep, "<f4").tolist() == [2.5]
    for ragged in ([[1, 2], [3]], [[1, 2], 3], [[1], [[2]]], [[[1]], [2]], [1, [2]]):
        with pytest.raises(CodecError, match="rectangular"):
            decode(ragged, "<f4")


def test_flat_only_where_the_protocol_is_flat():
    with pytest.raises(CodecError, match=r"element 0 is \[1\], not a number"):
        decode([[1], [2]], "<f4", nested=False)


def test_empty_and_not_a_list():
    assert decode([], "<i8").size == 0 and decode([], "<f4").size == 0
    with pytest.raises(CodecError, match="must be a list"):
        decode(5, "<f4")


@pytest.mark.parametrize("encoding", list(codec.Encoding))
@pytest.mark.parametrize("dtype, values", [
    ("<i8", [2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 1]),
    ("<u8", [2**64 - 1, 2**63, 2**53 + 1, 0]),
    ("<f8", [5e-324, -0.0, 1.7976931348623157e308, 0.1]),
])
def test_8_byte_elements_round_trip_in_every_encoding(encoding, dtype, values):
    """/v1's buffers (client.codec) of 8-byte elements: JSON numbers, base64 and binary frames, exactly."""
    buffer = np.array(values, dtype).view(np.uint8)
    data = codec.encode_data(buffer, np.dtype(dtype), buffer.nbytes, encoding)
    binary = None
    if encoding is codec.Encoding.BINARY:
        parts, n = codec.encode_frame({"d": data}, [buffer])
        header, tail = codec.split_frame(b"".join(bytes(p) for p in parts), str(n))
        data, binary = header["d"], codec.binary_slices([("d", header["d"])], tail)["d"]
    else:
        data = codec.parse_header(memoryview(orjson.dumps({"d": data})))["d"]  # through the text
    back = codec.decode_data(data, np.dtype(dtype), buffer.nbytes, buffer.nbytes, "d", binary)
    assert back.tobytes() == buffer.tobytes()
