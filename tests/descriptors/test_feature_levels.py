"""DirectML's per-level tensor support, applied when a request pins a feature level."""
from __future__ import annotations

import numpy as np
import pytest

from service.descriptors import FeatureLevel
from service.errors import DescriptorError
from tests.helpers import make_op

FL = FeatureLevel


@pytest.mark.parametrize(
    "kind,sizes,level,field",
    [
        ("SOFTSIGN", (1, 2, 3, 4), FL.FL_1_0, None),
        ("SOFTSIGN", (2, 3, 4), FL.FL_1_0, "InputTensor.DimensionCount"),       # 4-D only at 1_0
        ("SOFTSIGN", (1, 1, 2, 3, 4), FL.FL_1_0, "InputTensor.DimensionCount"),
        ("SOFTSIGN", (1, 1, 2, 3, 4), FL.FL_2_0, None),                         # 4 to 5-D at 2_0
        ("SOFTSIGN", (2, 3), FL.FL_2_0, "InputTensor.DimensionCount"),
        ("SOFTSIGN", (2, 3), FL.FL_3_0, None),                                  # 1 to 8-D from 3_0
        ("SHRINK", (1, 2, 3, 4), FL.FL_1_0, "FeatureLevel"),                    # SHRINK arrived at 2_0
        ("SHRINK", (1, 2, 3, 4), FL.FL_2_0, None),
        ("CELU", (5,), FL.FL_2_1, "FeatureLevel"),                              # CELU arrived at 3_0
        ("CELU", (5,), FL.FL_3_0, None),
        ("SCALED_TANH", (0, 1, 1, 1), FL.FL_6_4, "InputTensor.Sizes"),          # DirectML has no empty tensors
    ],
)
def test_feature_level_constraints(kind, sizes, level, field):
    op = make_op(kind, np.float32, sizes)
    if field is None:
        op.check_feature_level(level)
    else:
        with pytest.raises(DescriptorError) as info:
            op.check_feature_level(level)
        assert info.value.field == field


def test_levels_are_ordered_by_their_directml_values():
    assert FL.FL_5_1.code == 0x5100
    assert FL.FL_1_0 < FL.FL_2_0 < FL.FL_6_4
    assert sorted(FL, key=lambda f: f.code) == list(FL)
