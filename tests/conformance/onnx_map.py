"""Which ONNX operator each DirectML activation is, and how the fields map (the reference's §5)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OnnxCounterpart:
    op_type: str
    attributes: dict[str, str] = field(default_factory=dict)  # ONNX attribute -> DirectML field
    fixed: dict[str, float] = field(default_factory=dict)     # DirectML fields ONNX cannot vary
    opset: int = 22
    ort_float16: bool = False                                  # ONNX Runtime's CPU kernel takes float16
    # Where an input is +-inf, ONNX's formula may evaluate inf/inf or inf*0 (NaN); vkact returns the
    # limit instead, as its own reference states: those positions are checked against that reference.
    limits_at_infinity: bool = False
    # ONNX's reference evaluator computes float16 in float16, which cancels where the formula does
    # (Gelu's 1 + erf(x / sqrt 2) for x < 0): float16 is then checked against its float32 result.
    reference_float16_in_float32: bool = False
    # The softmax family: ONNX's integer ``axis`` (Softmax/LogSoftmax/Hardmax 13) is the descriptor's
    # one reduced axis. ``two_d``: DirectML's legacy operators take an effective rank of at most 2, so
    # inputs are viewed as (rows, last dimension). ``node_tests``: the node cases that apply, when not
    # all of NODE_TESTS[op_type] do (the legacy operators: the 2-D ones).
    axis: bool = False
    two_d: bool = False
    node_tests: tuple[str, ...] = ()
    # ONNX Runtime's Hardmax compares with >, so a row holding NaN gets its 1 at a number; ONNX's
    # reference evaluator (numpy's argmax) and vkact put it at the first NaN: such rows are checked
    # against the reference evaluator only.
    ort_skips_nan: bool = False
    # ONNX's reference evaluator computes LogSoftmax as log(Softmax(x)), which loses digits where the
    # softmax is subnormal and gives -inf below it (x - max < about -87 in float32): results below
    # REFERENCE_LOG_FLOOR are checked against ONNX Runtime only.
    log_of_softmax: bool = False


REFERENCE_LOG_FLOOR = -80.0


ONNX = {
    "DML_OPERATOR_ACTIVATION_CELU": OnnxCounterpart("Celu", {"alpha": "Alpha"}),
    "DML_OPERATOR_ACTIVATION_ELU": OnnxCounterpart("Elu", {"alpha": "Alpha"}),
    "DML_OPERATOR_ACTIVATION_GELU": OnnxCounterpart("Gelu", opset=20, limits_at_infinity=True, reference_float16_in_float32=True),
    "DML_OPERATOR_ACTIVATION_HARDMAX": OnnxCounterpart(
        "Hardmax", opset=13, ort_float16=True, axis=True, two_d=True, ort_skips_nan=True,
        node_tests=("test_hardmax_example", "test_hardmax_one_hot")),
    "DML_OPERATOR_ACTIVATION_HARDMAX1": OnnxCounterpart("Hardmax", opset=13, ort_float16=True, axis=True, ort_skips_nan=True),
    "DML_OPERATOR_ACTIVATION_HARD_SIGMOID": OnnxCounterpart("HardSigmoid", {"alpha": "Alpha", "beta": "Beta"}),
    "DML_OPERATOR_ACTIVATION_HARD_SWISH": OnnxCounterpart("HardSwish", fixed={"Alpha": 1 / 6, "Beta": 0.5}, limits_at_infinity=True),
    "DML_OPERATOR_ACTIVATION_IDENTITY": OnnxCounterpart("Identity", ort_float16=True),
    "DML_OPERATOR_ACTIVATION_LEAKY_RELU": OnnxCounterpart("LeakyRelu", {"alpha": "Alpha"}, ort_float16=True),
    "DML_OPERATOR_ACTIVATION_LOG_SOFTMAX": OnnxCounterpart(
        "LogSoftmax", opset=13, ort_float16=True, axis=True, two_d=True, reference_float16_in_float32=True, log_of_softmax=True,
        node_tests=("test_logsoftmax_example_1", "test_logsoftmax_large_number")),
    "DML_OPERATOR_ACTIVATION_LOG_SOFTMAX1": OnnxCounterpart(
        "LogSoftmax", opset=13, ort_float16=True, axis=True, reference_float16_in_float32=True, log_of_softmax=True),
    "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU": OnnxCounterpart("PRelu", opset=16),
    "DML_OPERATOR_ACTIVATION_RELU": OnnxCounterpart("Relu", ort_float16=True, opset=14),
    "DML_OPERATOR_ACTIVATION_SCALED_ELU": OnnxCounterpart("Selu", {"alpha": "Alpha", "gamma": "Gamma"}),
    "DML_OPERATOR_ACTIVATION_SHRINK": OnnxCounterpart("Shrink", {"bias": "Bias", "lambd": "Threshold"}, opset=9),
    "DML_OPERATOR_ACTIVATION_SIGMOID": OnnxCounterpart("Sigmoid", ort_float16=True, opset=13),
    "DML_OPERATOR_ACTIVATION_SOFTMAX": OnnxCounterpart(
        "Softmax", opset=13, ort_float16=True, axis=True, two_d=True, reference_float16_in_float32=True,
        node_tests=("test_softmax_example", "test_softmax_large_number")),
    "DML_OPERATOR_ACTIVATION_SOFTMAX1": OnnxCounterpart(
        "Softmax", opset=13, ort_float16=True, axis=True, reference_float16_in_float32=True),
    "DML_OPERATOR_ACTIVATION_SOFTPLUS": OnnxCounterpart("Softplus", fixed={"Steepness": 1.0}),
    "DML_OPERATOR_ACTIVATION_SOFTSIGN": OnnxCounterpart("Softsign", limits_at_infinity=True),
    "DML_OPERATOR_ACTIVATION_SWISH": OnnxCounterpart("Swish", {"alpha": "SigmoidInputScale"}, opset=24, limits_at_infinity=True),
    "DML_OPERATOR_ACTIVATION_TANH": OnnxCounterpart("Tanh", ort_float16=True, opset=13),
    "DML_OPERATOR_ACTIVATION_THRESHOLDED_RELU": OnnxCounterpart("ThresholdedRelu", {"alpha": "Alpha"}),
}

#: Operators with no ONNX operator today: checked against their formula in float64 instead.
NO_COUNTERPART = {
    "DML_OPERATOR_ACTIVATION_SCALED_TANH",        # experimental ScaledTanh, removed before opset 10
    "DML_OPERATOR_ACTIVATION_LINEAR",             # experimental Affine
    "DML_OPERATOR_ACTIVATION_PARAMETRIC_SOFTPLUS",  # experimental ParametricSoftplus
    "DML_OPERATOR_ACTIVATION_RELU_GRAD",          # training; no ONNX operator
}

#: ONNX node test cases (onnx.backend.test.case.node) per ONNX operator.
NODE_TESTS = {
    "Celu": ["test_celu"], "Elu": ["test_elu", "test_elu_default", "test_elu_example"],
    "Gelu": ["test_gelu_default_1", "test_gelu_default_2"],
    "Hardmax": ["test_hardmax_axis_0", "test_hardmax_axis_1", "test_hardmax_axis_2", "test_hardmax_default_axis",
                "test_hardmax_example", "test_hardmax_negative_axis", "test_hardmax_one_hot"],
    "LogSoftmax": ["test_logsoftmax_axis_0", "test_logsoftmax_axis_1", "test_logsoftmax_axis_2", "test_logsoftmax_default_axis",
                   "test_logsoftmax_example_1", "test_logsoftmax_large_number", "test_logsoftmax_negative_axis"],
    "Softmax": ["test_softmax_axis_0", "test_softmax_axis_1", "test_softmax_axis_2", "test_softmax_default_axis",
                "test_softmax_example", "test_softmax_large_number", "test_softmax_negative_axis"],
    "HardSigmoid": ["test_hardsigmoid", "test_hardsigmoid_default", "test_hardsigmoid_example"],
    "HardSwish": ["test_hardswish"], "Identity": ["test_identity"],
    "LeakyRelu": ["test_leakyrelu", "test_leakyrelu_default", "test_leakyrelu_example"],
    "PRelu": ["test_prelu_broadcast", "test_prelu_example"], "Relu": ["test_relu"],
    "Selu": ["test_selu", "test_selu_default", "test_selu_example"],
    "Shrink": ["test_shrink_hard", "test_shrink_soft"], "Sigmoid": ["test_sigmoid", "test_sigmoid_example"],
    "Softplus": ["test_softplus", "test_softplus_example"], "Softsign": ["test_softsign", "test_softsign_example"],
    "Swish": ["test_swish"], "Tanh": ["test_tanh", "test_tanh_example"],
    "ThresholdedRelu": ["test_thresholdedrelu", "test_thresholdedrelu_default", "test_thresholdedrelu_example"],
}
