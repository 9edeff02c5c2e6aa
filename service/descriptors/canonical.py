"""Descriptors that pickle alike when they compare alike: the canonical key of "the same request again".

pydantic pickles a model's ``model_fields_set`` beside its values, so RELU with and without
``DimensionCount`` (equal once validated: the validator fills it in) pickled to different bytes, and the
worker's caches and the batcher, which know a descriptor by its pickled bytes, took them for two. These
models pickle every field as set: equal descriptors give equal bytes, and that is the key (see
``service.worker.descriptor_key``), computed once per request (header caches keep it).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_ALL_SET: dict[type, set[str]] = {}  # one set per class: the same object pickles to the same bytes


class CanonicalModel(BaseModel):
    """A frozen descriptor model whose pickle depends on its values only (not on what the caller spelled)."""

    def __getstate__(self) -> dict[Any, Any]:
        cls = type(self)
        fields = _ALL_SET.get(cls)
        if fields is None:
            fields = _ALL_SET[cls] = set(cls.model_fields)
        return {
            "__dict__": self.__dict__,
            "__pydantic_extra__": self.__pydantic_extra__,
            "__pydantic_fields_set__": fields,
            "__pydantic_private__": self.__pydantic_private__,
        }
