"""client/_operators.py is generated from the registry and must be up to date."""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

import pytest

from service import client_codegen
from service.descriptors import TensorDesc
from service.operators import OPERATORS, OperatorDesc
from service.operators.base import Scalar


def test_generated_file_is_up_to_date() -> None:
    assert client_codegen.main(["--check"]) == 0, "run: python -m service.client_codegen"


def test_check_fails_on_a_stale_file(tmp_path, capsys) -> None:
    stale = tmp_path / "_operators.py"
    stale.write_text("# old\n")
    assert client_codegen.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert client_codegen.main(["--output", str(stale)]) == 0
    assert client_codegen.main(["--check", "--output", str(stale)]) == 0


class FakeGrad(OperatorDesc):
    """DML_ACTIVATION_FAKE_GRAD_OPERATOR_DESC: a two-input operator shaped like RELU_GRAD, for the
    generator only; its \\ and \"\"\" must survive the docstring."""

    Type: Literal["DML_OPERATOR_ACTIVATION_FAKE_GRAD"] = "DML_OPERATOR_ACTIVATION_FAKE_GRAD"
    InputTensor: TensorDesc
    InputGradientTensor: TensorDesc
    OutputGradientTensor: Optional[TensorDesc] = None
    Lambda: Scalar
    LeakySlope: Scalar = 0.01

    input_fields: ClassVar[tuple[str, ...]] = ("InputTensor", "InputGradientTensor")
    output_field: ClassVar[str] = "OutputGradientTensor"
    formula_text: ClassVar[str] = "dy * (x > 0)"


def test_names_are_derived_generically() -> None:
    assert client_codegen.argument_names(FakeGrad) == (["x", "input_gradient"], ["lambda_", "leaky_slope"])
    assert client_codegen.struct_name("DML_OPERATOR_ELEMENT_WISE_ADD") == "DML_ELEMENT_WISE_ADD_OPERATOR_DESC"
    assert client_codegen.snake("GuaranteedBaseOffsetAlignment") == "guaranteed_base_offset_alignment"


def test_multi_input_operator_renders_a_working_method() -> None:
    namespace: dict = {}
    exec(compile(client_codegen.render([*OPERATORS.values(), FakeGrad]), "<generated>", "exec"), namespace)
    info = namespace["OPERATORS"]["fake_grad"]
    assert info == ("DML_OPERATOR_ACTIVATION_FAKE_GRAD", ("InputTensor", "InputGradientTensor"), "OutputGradientTensor",
                    ("Lambda", "LeakySlope"), {"LeakySlope": 0.01})

    class Recorder(namespace["OperatorMethods"]):
        def execute(self, *args, **kwargs):
            return args, kwargs

    args, kwargs = Recorder().fake_grad("x", "dy", lambda_=2.0, in_place=True)
    assert args == ("DML_OPERATOR_ACTIVATION_FAKE_GRAD", "x", "dy")
    assert kwargs == {"params": {"Lambda": 2.0, "LeakySlope": 0.01}, "in_place": True}
    doc = Recorder.fake_grad.__doc__
    assert "y = dy * (x > 0)" in doc and '\\ and """' in doc and "lambda_: Lambda (required)." in doc
    with pytest.raises(TypeError):
        Recorder().fake_grad("x", "dy")  # Lambda has no DirectML default


def test_reserved_names_are_refused() -> None:
    class Execute(FakeGrad):
        Type: Literal["DML_OPERATOR_ACTIVATION_EXECUTE"] = "DML_OPERATOR_ACTIVATION_EXECUTE"

    with pytest.raises(ValueError, match="cannot be a client method"):
        client_codegen.render([Execute])
