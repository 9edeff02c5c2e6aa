"""DML_BUFFER_TENSOR_DESC rules: the size formula, and errors that name the offending field."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from service.descriptors import DataType, TensorDesc, calc_buffer_tensor_size
from service.operators import OPERATORS, descriptor_error, parse_operator
from tests.helpers import any_op, tensor

F32, F16 = DataType.FLOAT32, DataType.FLOAT16


@pytest.mark.parametrize(
    "dtype,sizes,strides,expected",
    [
        (F32, (1, 1, 3, 5), None, 60),
        (F16, (3,), None, 8),                    # 6 bytes rounded up to a DWORD
        (F32, (1, 1, 3, 5), (15, 15, 5, 1), 60),
        (F32, (2, 3), (5, 1), 32),               # padded rows: (1*5 + 2*1 + 1) * 4
        (F32, (4, 3, 2, 2), (0, 1, 0, 0), 12),   # per-channel vector broadcast to NCHW
        (F16, (2, 2), (1, 2), 8),                # column-major: last index 1 + 2 = 3, 4 halves
        (F32, (0, 5), None, 0),
    ],
)
def test_calc_buffer_tensor_size(dtype, sizes, strides, expected):
    """DMLCalcBufferTensorSize, hand-computed."""
    assert calc_buffer_tensor_size(dtype, sizes, strides) == expected


def test_total_size_defaults_to_the_minimum_and_may_be_larger():
    assert TensorDesc(DataType=F32, Sizes=(2, 3)).TotalTensorSizeInBytes == 24
    assert TensorDesc(DataType=F32, Sizes=(2, 3), TotalTensorSizeInBytes=64).total_bytes == 64
    assert TensorDesc(DataType=F32, Sizes=(2, 3)).DimensionCount == 2


def error_field(body: dict) -> tuple[str, str]:
    with pytest.raises(ValidationError) as info:
        parse_operator(body)
    err = descriptor_error(info.value)
    return err.field, err.message


def shrink(**fields) -> dict:
    return {"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "InputTensor": tensor(np.float32, (2, 3)), **fields}


@pytest.mark.parametrize(
    "body,field,words",
    [
        (shrink(OutputTensor=tensor(np.float32, (2, 4))), "OutputTensor.Sizes", "must equal"),
        (shrink(OutputTensor=tensor(np.float32, (2, 3, 1))), "OutputTensor.DimensionCount", "must equal"),
        (shrink(OutputTensor=tensor(np.float16, (2, 3))), "OutputTensor.DataType", "must equal"),
        (shrink(InputTensor=tensor(np.float32, ())), "InputTensor.DimensionCount", "1 to 8"),
        (shrink(InputTensor=tensor(np.float32, (1,) * 9)), "InputTensor.DimensionCount", "1 to 8"),
        (shrink(InputTensor=tensor(np.float32, (2, 3), DimensionCount=3)), "InputTensor.DimensionCount", "Sizes has 2"),
        (shrink(InputTensor=tensor(np.float32, (2, 3), TotalTensorSizeInBytes=20)), "InputTensor.TotalTensorSizeInBytes", "at least 24"),
        (shrink(InputTensor=tensor(np.float32, (2, 3), (3,))), "InputTensor.Strides", "entries"),
        (shrink(InputTensor=tensor(np.float32, (2, -3))), "InputTensor.Sizes[1]", "greater than or equal"),
        (shrink(InputTensor=tensor(np.float32, (2, 3), GuaranteedBaseOffsetAlignment=3)), "InputTensor.GuaranteedBaseOffsetAlignment", "power of two"),
        (shrink(InputTensor={"DataType": "DML_TENSOR_DATA_TYPE_BFLOAT16", "Sizes": [2]}), "InputTensor.DataType", "Input should be"),
        ({"Type": "DML_OPERATOR_ACTIVATION_SOFTSIGN", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_INT32", "Sizes": [2]}}, "InputTensor.DataType", "does not support"),
        ({"Type": "DML_OPERATOR_ACTIVATION_CELU", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_INT64", "Sizes": [2]}}, "InputTensor.DataType", "does not support"),
        (shrink(OutputTensor=tensor(np.float32, (2, 3), (1, 1))), "OutputTensor.Strides", "share one position"),
        (shrink(Threshold=float("nan")), "Threshold", "finite"),
        # finite as a float64, an infinity as the float32 the kernel gets
        (shrink(Bias=1e39), "Bias", "float32"),
        (shrink(Bias=True), "Bias", "boolean"),
        (shrink(Threshold=-3.5e38), "Threshold", "float32"),
        (shrink(Bias="a lot"), "Bias", "valid number"),
        (shrink(Lambda=1.0), "Lambda", "not permitted"),
        ({**shrink(), "Type": "DML_OPERATOR_ACTIVATION_SHRINKAGE"}, "Type", "unknown operator"),
        ({"InputTensor": tensor(np.float32, (2,))}, "Type", "unknown operator"),
        ({"Type": "DML_OPERATOR_ACTIVATION_CELU", "InputTensor": tensor(np.float32, (2,)), "Alpha": 0.0}, "Alpha", "must not be 0"),
        # subnormal as a float32 (a device may flush it to 0), or 0 once rounded to float32
        ({"Type": "DML_OPERATOR_ACTIVATION_CELU", "InputTensor": tensor(np.float32, (2,)), "Alpha": -2.4748388e-39}, "Alpha", "must not be 0"),
        ({"Type": "DML_OPERATOR_ACTIVATION_SOFTPLUS", "InputTensor": tensor(np.float32, (2,)), "Steepness": 1e-50}, "Steepness", "must not be 0"),
    ],
)
def test_invalid_descriptors_name_the_field(body, field, words):
    got_field, message = error_field(body)
    assert got_field == field
    assert words in message


def test_omitted_output_takes_the_input_layout_or_packed_when_broadcasting():
    strided = parse_operator(shrink(InputTensor=tensor(np.float32, (2, 3), (1, 2))))
    assert strided.output.Strides == (1, 2)
    broadcast = parse_operator(shrink(InputTensor=tensor(np.float32, (2, 3), (0, 1))))
    assert broadcast.output.Strides is None and broadcast.output.total_bytes == 24
    # overlapping strides (an element read twice, not a zero stride): packed too, not a 422 on a field not sent
    overlapping = parse_operator(shrink(InputTensor=tensor(np.float32, (3, 2), (1, 1))))
    assert overlapping.output.Strides is None and overlapping.output.total_bytes == 24


def test_registry_entries_are_complete():
    """Every operator: DML name, a shader file, a reference that differs from the identity, defaults."""
    from service.config import Settings

    x = np.linspace(-3, 3, 13)
    for name, op in OPERATORS.items():
        assert name.startswith("DML_OPERATOR_ACTIVATION_")
        assert all((Settings().glsl_dir / f"{k}.comp").is_file() for k in op.all_kernels())
        desc = any_op(name, np.float32, (13,))
        inputs = [x] + [np.full(13, 0.5)] * (len(op.input_fields) - 1)
        if name not in ("DML_OPERATOR_ACTIVATION_IDENTITY", "DML_OPERATOR_ACTIVATION_LINEAR"):  # LINEAR: Alpha 1, Beta 0
            assert not np.array_equal(desc.formula(*inputs), x), name
        assert op.__doc__ and op.formula_text


def test_documented_defaults():
    d = {n: any_op(n, np.float32, (1,)) for n in OPERATORS}
    assert d["DML_OPERATOR_ACTIVATION_SHRINK"].scalars() == (0.0, 0.5)           # Bias, Threshold
    assert d["DML_OPERATOR_ACTIVATION_CELU"].scalars() == (1.0,)                 # Alpha
    assert d["DML_OPERATOR_ACTIVATION_SCALED_TANH"].scalars() == (1.0, 0.5)      # Alpha, Beta
    assert d["DML_OPERATOR_ACTIVATION_SOFTSIGN"].scalars() == ()
