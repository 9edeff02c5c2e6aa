"""DML_FEATURE_LEVEL and the tensor support that DirectML documents per level.

An operator carries a ``TensorSupport`` (which dimension counts and data types it accepts from which
level on); ``check`` applies it when a request pins a feature level, so a client that targets an older
DirectML gets the answer it would get there.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .datatypes import DataType


class FeatureLevel(str, Enum):
    """DML_FEATURE_LEVEL; the value is the JSON spelling."""

    FL_1_0 = "DML_FEATURE_LEVEL_1_0"
    FL_2_0 = "DML_FEATURE_LEVEL_2_0"
    FL_2_1 = "DML_FEATURE_LEVEL_2_1"
    FL_3_0 = "DML_FEATURE_LEVEL_3_0"
    FL_3_1 = "DML_FEATURE_LEVEL_3_1"
    FL_4_0 = "DML_FEATURE_LEVEL_4_0"
    FL_4_1 = "DML_FEATURE_LEVEL_4_1"
    FL_5_0 = "DML_FEATURE_LEVEL_5_0"
    FL_5_1 = "DML_FEATURE_LEVEL_5_1"
    FL_5_2 = "DML_FEATURE_LEVEL_5_2"
    FL_6_0 = "DML_FEATURE_LEVEL_6_0"
    FL_6_1 = "DML_FEATURE_LEVEL_6_1"
    FL_6_2 = "DML_FEATURE_LEVEL_6_2"
    FL_6_3 = "DML_FEATURE_LEVEL_6_3"
    FL_6_4 = "DML_FEATURE_LEVEL_6_4"

    @property
    def code(self) -> int:
        """The DirectML.h value, e.g. 0x5100 for 5_1, which orders the levels."""
        major, minor = self.name[3:].split("_")
        return int(major) << 12 | int(minor) << 8

    def __ge__(self, other: FeatureLevel) -> bool:  # type: ignore[override]
        return self.code >= other.code

    def __lt__(self, other: FeatureLevel) -> bool:  # type: ignore[override]
        return self.code < other.code


#: The level whose semantics vkact implements (the newest DirectML.h, DML_TARGET_VERSION 0x6400).
IMPLEMENTED_LEVEL = FeatureLevel.FL_6_4

FLOATS = frozenset({DataType.FLOAT32, DataType.FLOAT16})


@dataclass(frozen=True)
class LevelSupport:
    """From ``level`` on: dimension counts ``min_dims..max_dims`` and these data types."""

    level: FeatureLevel
    min_dims: int
    max_dims: int
    data_types: frozenset[DataType]


@dataclass(frozen=True)
class TensorSupport:
    """An operator's tensor support history, oldest level first."""

    steps: tuple[LevelSupport, ...]

    def at(self, level: FeatureLevel) -> LevelSupport | None:
        """What the operator accepts at ``level``; None if it did not exist yet."""
        current = None
        for step in self.steps:
            if level >= step.level:
                current = step
        return current

    @property
    def introduced(self) -> FeatureLevel:
        return self.steps[0].level


def legacy_float(introduced: FeatureLevel = FeatureLevel.FL_1_0) -> TensorSupport:
    """The 1_0-era float activations: 4-D at 1_0, 4 to 5-D at 2_0, 1 to 8-D from 3_0."""
    history = [
        LevelSupport(FeatureLevel.FL_1_0, 4, 4, FLOATS),
        LevelSupport(FeatureLevel.FL_2_0, 4, 5, FLOATS),
        LevelSupport(FeatureLevel.FL_3_0, 1, 8, FLOATS),
    ]
    first = max(i for i, s in enumerate(history) if not introduced < s.level)
    steps = [LevelSupport(introduced, history[first].min_dims, history[first].max_dims, FLOATS)]
    steps += history[first + 1:]
    return TensorSupport(tuple(steps))


def modern_float(introduced: FeatureLevel) -> TensorSupport:
    """Operators introduced at 3_0 or later: 1 to 8 dimensions, FLOAT32/FLOAT16, from the start."""
    return TensorSupport((LevelSupport(introduced, 1, 8, FLOATS),))


INTEGERS_SIGNED = frozenset({DataType.INT32, DataType.INT16, DataType.INT8})
INTEGERS_UNSIGNED = frozenset({DataType.UINT32, DataType.UINT16, DataType.UINT8})


def with_types(support: TensorSupport, level: FeatureLevel, types: frozenset[DataType]) -> TensorSupport:
    """``support`` with ``types`` accepted from ``level`` on (DirectML's 5_1 integer support)."""
    current = support.at(level)
    assert current is not None, "the operator must exist at that level"
    steps = {s.level: s for s in support.steps}
    steps.setdefault(level, LevelSupport(level, current.min_dims, current.max_dims, current.data_types))
    widened = [
        LevelSupport(s.level, s.min_dims, s.max_dims, s.data_types | types) if s.level >= level else s
        for s in steps.values()
    ]
    return TensorSupport(tuple(sorted(widened, key=lambda s: s.level.code)))
