"""The operator registry: one explicit entry per operator. Routes, the catalog and the client's
methods are generated from it, so adding an operator means one shader, one module and one line here."""
from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from ..errors import DescriptorError

from .base import ActivationDesc, OperatorDesc
from .celu import Celu
from .elu import Elu
from .gelu import Gelu
from .hard_sigmoid import HardSigmoid
from .hard_swish import HardSwish
from .hardmax import Hardmax, Hardmax1
from .identity import Identity
from .leaky_relu import LeakyRelu
from .linear import Linear
from .log_softmax import LogSoftmax, LogSoftmax1
from .parameterized_relu import ParameterizedRelu
from .parametric_softplus import ParametricSoftplus
from .relu import Relu
from .relu_grad import ReluGrad
from .scaled_elu import ScaledElu
from .scaled_tanh import ScaledTanh
from .shrink import Shrink
from .sigmoid import Sigmoid
from .softmax import Softmax, Softmax1
from .softplus import Softplus
from .softsign import Softsign
from .swish import Swish
from .tanh import Tanh
from .thresholded_relu import ThresholdedRelu

OPERATORS: dict[str, type[OperatorDesc]] = {
    op.type_name(): op
    for op in (
        Celu,
        Elu,
        Gelu,
        HardSigmoid,
        HardSwish,
        Hardmax,
        Hardmax1,
        Identity,
        LeakyRelu,
        Linear,
        LogSoftmax,
        LogSoftmax1,
        ParameterizedRelu,
        ParametricSoftplus,
        Relu,
        ReluGrad,
        ScaledElu,
        ScaledTanh,
        Shrink,
        Sigmoid,
        Softmax,
        Softmax1,
        Softplus,
        Softsign,
        Swish,
        Tanh,
        ThresholdedRelu,
    )
}

#: Any registered operator descriptor, discriminated by its ``Type`` (the DML_OPERATOR_* name).
OperatorDescriptor = Annotated[Union[tuple(OPERATORS.values())], Field(discriminator="Type")]  # type: ignore[valid-type]
_ADAPTER: TypeAdapter[OperatorDesc] = TypeAdapter(OperatorDescriptor)


def parse_operator(data: Any) -> OperatorDesc:
    """Validate a JSON-like dict into its operator model (raises pydantic.ValidationError)."""
    return _ADAPTER.validate_python(data)


def short_name(op: type[OperatorDesc]) -> str:
    """'DML_OPERATOR_ACTIVATION_SCALED_TANH' -> 'scaled_tanh' (the /v2 model and client method name)."""
    return op.type_name().removeprefix("DML_OPERATOR_ACTIVATION_").lower()


__all__ = ["OPERATORS", "descriptor_error", "ActivationDesc", "OperatorDesc", "OperatorDescriptor", "parse_operator", "short_name"]


def descriptor_error(exc: ValidationError, prefix: tuple[str, ...] = ()) -> DescriptorError:
    """The first pydantic error as a DescriptorError whose field is a dotted path (``InputTensor.Sizes[2]``)."""
    err = exc.errors(include_url=False)[0]
    path = list(prefix)
    for part in err["loc"]:
        if part in OPERATORS:
            continue
        if isinstance(part, int) and path:
            path[-1] += f"[{part}]"
        else:
            path.append(str(part))
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # (a graph node's Operator: its path)
        known = ", ".join(OPERATORS)
        got = err.get("ctx", {}).get("tag", "nothing")
        return DescriptorError(".".join((*path, "Type")), f"unknown operator Type {got!r}; known: {known}")
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, DescriptorError):
        path.append(cause.field or "")
        message = cause.message
    else:
        message = err["msg"].removeprefix("Value error, ")
    field = ".".join(p for p in path if p)
    return DescriptorError(field, f"{field}: {message}" if field and not message.startswith(field) else message)
