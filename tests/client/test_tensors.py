"""Descriptors and buffers built from numpy arrays, and arrays read back from descriptors."""
from __future__ import annotations

import numpy as np
import pytest

from client.buffers import view
from client.tensors import DATA_TYPES, Layout, data_type_name, from_array, output_desc, to_array

F32, F16 = "DML_TENSOR_DATA_TYPE_FLOAT32", "DML_TENSOR_DATA_TYPE_FLOAT16"


def grid(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape)


def roundtrip(t) -> np.ndarray:
    strides = t.desc.get("Strides")
    return view(t.buffer, t.dtype, tuple(t.desc["Sizes"]), None if strides is None else tuple(strides))


def test_contiguous_has_no_strides_and_is_sent_as_is() -> None:
    x = grid(2, 3)
    t = from_array(x)
    assert t.desc == {"DataType": F32, "Sizes": [2, 3], "TotalTensorSizeInBytes": 24}
    assert t.buffer.tobytes() == x.tobytes()
    assert np.shares_memory(t.buffer, x)  # no copy on the way out


def test_float16_is_padded_to_whole_dwords() -> None:
    x = np.array([1.5, -2.0, 3.25], np.float16)
    t = from_array(x)
    assert t.desc == {"DataType": F16, "Sizes": [3], "TotalTensorSizeInBytes": 8}
    assert t.buffer.tobytes() == x.tobytes() + b"\0\0"


def test_zero_d_becomes_shape_1() -> None:
    t = from_array(np.float32(2.5))
    assert t.desc == {"DataType": F32, "Sizes": [1], "TotalTensorSizeInBytes": 4}
    assert np.frombuffer(t.buffer, np.float32).tolist() == [2.5]


def test_every_other_column_sends_strides_and_the_span() -> None:
    x = grid(4, 6)
    v = x[:, ::2]
    t = from_array(v)
    # last element at 3*6 + 2*2 = 22: the span is 23 elements, padded to 24
    assert t.desc == {"DataType": F32, "Sizes": [4, 3], "Strides": [6, 2], "TotalTensorSizeInBytes": 92}
    assert t.span == 92
    assert t.buffer.tobytes() == x.reshape(-1)[:23].tobytes()
    np.testing.assert_array_equal(roundtrip(t), v)


def test_transpose_sends_strides_without_copying() -> None:
    x = grid(3, 5)
    t = from_array(x.T)
    assert t.desc["Sizes"] == [5, 3] and t.desc["Strides"] == [1, 5]
    assert t.buffer.nbytes == x.nbytes and np.shares_memory(t.buffer, x)
    np.testing.assert_array_equal(roundtrip(t), x.T)


def test_view_into_the_middle_of_a_base_starts_at_its_first_element() -> None:
    x = grid(5, 6)
    v = x[1:4, 2:5]
    t = from_array(v)
    assert t.desc["Strides"] == [6, 1] and t.desc["TotalTensorSizeInBytes"] == (2 * 6 + 2 + 1) * 4
    np.testing.assert_array_equal(roundtrip(t), v)


def test_broadcast_sends_zero_strides_and_one_row() -> None:
    row = np.array([1.0, 2.0, 3.0], np.float32)
    t = from_array(np.broadcast_to(row, (4, 3)))
    assert t.desc["Strides"] == [0, 1] and t.desc["TotalTensorSizeInBytes"] == 12
    np.testing.assert_array_equal(roundtrip(t), np.broadcast_to(row, (4, 3)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: grid(8)[::-1],                       # negative stride
        lambda: grid(3, 4)[:, ::-2],                 # negative inner stride
        lambda: grid(4, 12)[:, ::4],                 # mostly gaps: packing is cheaper
        lambda: np.ndarray((3,), np.float32, np.zeros(24, np.uint8), strides=(6,)),  # half elements
    ],
    ids=["reversed", "reversed-inner", "sparse", "unaligned"],
)
def test_unrepresentable_or_wasteful_views_are_packed(make) -> None:
    v = make()
    t = from_array(v)
    assert "Strides" not in t.desc
    assert t.desc["Sizes"] == list(v.shape) and t.buffer.tobytes() == np.ascontiguousarray(v).tobytes()


def test_size_one_dimension_stride_is_ignored() -> None:
    v = grid(3, 4)[::-1][:1, ::2]  # shape (1, 2), numpy keeps stride -16 on the size-1 dimension
    t = from_array(v)
    assert t.desc["Strides"] == [0, 2]
    np.testing.assert_array_equal(roundtrip(t), v)


def test_python_numbers_become_float32_but_numpy_arrays_keep_their_dtype() -> None:
    assert from_array([1.0, 2.5]).desc["DataType"] == F32
    assert from_array(2.5).desc == {"DataType": F32, "Sizes": [1], "TotalTensorSizeInBytes": 4}
    assert from_array(np.zeros(2)).desc["DataType"] == "DML_TENSOR_DATA_TYPE_FLOAT64"


def test_big_endian_is_sent_little_endian() -> None:
    x = np.array([1.0, -2.0], ">f4")
    t = from_array(x)
    assert t.desc["DataType"] == F32 and t.buffer.tobytes() == np.array([1.0, -2.0], "<f4").tobytes()


def test_empty_array() -> None:
    t = from_array(np.zeros((0, 3), np.float32))
    assert t.desc == {"DataType": F32, "Sizes": [0, 3], "TotalTensorSizeInBytes": 0} and t.buffer.nbytes == 0


@pytest.mark.parametrize("dtype", [np.complex64, np.bool_, object, "U3"])
def test_dtype_without_a_dml_type_is_a_type_error(dtype) -> None:
    with pytest.raises(TypeError, match="no DML_TENSOR_DATA_TYPE"):
        from_array(np.zeros(2, dtype))


def test_data_type_table_mirrors_the_service() -> None:
    from service.descriptors.datatypes import DataType

    assert DATA_TYPES == {t.value: t.info.numpy for t in DataType}
    assert data_type_name(np.dtype(np.int64)) == "DML_TENSOR_DATA_TYPE_INT64"


def test_output_desc() -> None:
    like = from_array(grid(2, 3)).desc
    assert output_desc(like, None) == {"DataType": F32, "Sizes": [2, 3], "TotalTensorSizeInBytes": 24}
    assert output_desc(like, (1, 2)) == {"DataType": F32, "Sizes": [2, 3], "Strides": [1, 2], "TotalTensorSizeInBytes": 24}


def test_to_array_copies_into_a_packed_array() -> None:
    buffer = np.arange(8, dtype=np.float32).view(np.uint8)
    out = to_array({"DataType": F32, "Sizes": [2, 2], "Strides": [1, 4], "TotalTensorSizeInBytes": 32}, buffer)
    np.testing.assert_array_equal(out, [[0, 4], [1, 5]])
    assert out.flags.owndata and out.flags.c_contiguous and out.flags.writeable


@pytest.mark.parametrize(
    "desc, match",
    [
        ({"DataType": F32, "Sizes": [4], "TotalTensorSizeInBytes": 8}, "less than"),
        ({"DataType": F32, "Sizes": [2, 2], "Strides": [1]}, "Strides for"),
        ({"DataType": F32, "Sizes": [-1]}, "non-negative"),
        ({"DataType": "DML_TENSOR_DATA_TYPE_BOOL", "Sizes": [1]}, "unknown DataType"),
    ],
)
def test_layout_rejects_descriptors_that_would_read_past_the_buffer(desc, match) -> None:
    with pytest.raises(ValueError, match=match):
        Layout.of(desc)
