from __future__ import annotations

import numpy as np
import pytest

from service.descriptors import DataType, TensorDesc
from service.layout import coalesce


def t(sizes, strides=None):
    return TensorDesc(DataType=DataType.FLOAT32, Sizes=sizes, Strides=strides)


@pytest.mark.parametrize(
    "tensors,sizes,strides",
    [
        ((t((2, 3, 4)), t((2, 3, 4))), (24,), ((1,), (1,))),                    # packed collapses
        ((t((1, 1, 5)), t((1, 1, 5), (9, 9, 1))), (5,), ((1,), (1,))),          # size-1 dims vanish
        ((t((2, 3, 4), (0, 4, 1)), t((2, 3, 4))), (2, 12), ((0, 1), (12, 1))),  # broadcast outer
        ((t((2, 3), (1, 2)), t((2, 3))), (2, 3), ((1, 2), (3, 1))),             # transpose stays
        ((t((2, 3), (4, 1)), t((2, 3))), (2, 3), ((4, 1), (3, 1))),             # padded rows stay
        ((t((1,)), t((1,))), (1,), ((1,), (1,))),
    ],
)
def test_coalesce(tensors, sizes, strides):
    layout = coalesce(tensors)
    assert layout.sizes == sizes and layout.strides == strides
    assert layout.count == int(np.prod(tensors[0].Sizes))
