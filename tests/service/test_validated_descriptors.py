"""/v2's validated descriptors by their dict (v2.codec.build_operator): a JSON tensor request repeats its
descriptor as a binary one repeats its header; what passed once is reused, what differs in a value's
JSON type is told apart, and an error is decided afresh each time."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.api.v2.codec import InferenceRequest, build_operator
from service.errors import VkactError
from service.operators import OPERATORS

SHRINK = OPERATORS["DML_OPERATOR_ACTIVATION_SHRINK"]
MAX = 1 << 30


def request(shape: list[int], datatype: str = "FP32", **parameters) -> InferenceRequest:
    return InferenceRequest.model_validate({"inputs": [{"name": "InputTensor", "shape": shape, "datatype": datatype, "data": [0] * 6}],
                                            "parameters": parameters})


def test_an_equal_descriptor_is_validated_once_and_shared():
    first = build_operator(SHRINK, request([2, 3], Bias=0.25, Threshold=1.5), MAX)
    again = build_operator(SHRINK, request([2, 3], Bias=0.25, Threshold=1.5), MAX)
    assert again is first
    assert (first.Bias, first.Threshold, tuple(first.InputTensor.Sizes)) == (0.25, 1.5, (2, 3))
    other = build_operator(SHRINK, request([3, 2], Bias=0.25, Threshold=1.5), MAX)
    assert other is not first and tuple(other.InputTensor.Sizes) == (3, 2)
    assert build_operator(SHRINK, request([2, 3], datatype="FP16", Bias=0.25, Threshold=1.5), MAX).data_type.value != first.data_type.value


def test_values_of_other_json_types_are_validated_apart():
    """1 and 1.0 are one Bias; the string "1" is not accepted where a number is (or is, by pydantic's own
    rule): whatever validation says of each, the cache answers the same as validation does."""
    numbers = [build_operator(SHRINK, request([4], Bias=b), MAX) for b in (1, 1.0)]
    assert numbers[0] is not numbers[1] and numbers[0].Bias == numbers[1].Bias == 1.0
    for odd in ("1", True, None, [1]):
        def build() -> object:
            return build_operator(SHRINK, request([4], Bias=odd), MAX)
        try:
            fresh = build()
        except (VkactError, ValidationError) as exc:
            with pytest.raises(type(exc)):
                build()  # refused again, not answered from the cache
        else:
            assert build() is fresh


def test_an_error_is_decided_afresh_and_the_limit_is_part_of_the_key():
    op = build_operator(SHRINK, request([1024]), MAX)
    with pytest.raises(VkactError):
        build_operator(SHRINK, request([1024]), 1024)  # 4,096 bytes over a 1,024-byte device limit
    with pytest.raises(VkactError):
        build_operator(SHRINK, request([1024]), 1024)
    assert build_operator(SHRINK, request([1024]), MAX) is op
    with pytest.raises(VkactError):
        build_operator(SHRINK, request([1024], Nope=1), MAX)
