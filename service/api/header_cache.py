"""Parsed inference headers, by their bytes.

Serving clients send the same descriptor again and again with new tensor bytes: a binary frame's JSON
header (operator, shapes, parameters) repeats byte for byte. What the header decides (the validated
descriptor, its pickled form for the worker, where each input lies in the body, the response's
header) is kept here, so a repeated header skips JSON parsing and validation. Only headers whose
tensors all travel as binary data are kept (JSON data would make every key unique), and only
those that passed validation: an error is always decided afresh.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

from ..limits import HEADER_CACHE_ENTRIES as ENTRIES
from ..limits import MAX_HEADER_BYTES


class HeaderCache(Generic[T]):
    def __init__(self, entries: int = ENTRIES) -> None:
        self._entries: OrderedDict[Hashable, T] = OrderedDict()
        self._limit = entries
        self.hits = self.misses = 0

    @staticmethod
    def key(header: bytes | memoryview, *context: Hashable) -> Hashable | None:
        """The key of ``header`` read in ``context`` (what else decides its parse), or None when the
        header is too long to keep."""
        return (bytes(header), *context) if len(header) <= MAX_HEADER_BYTES else None

    def get(self, key: Hashable | None) -> T | None:
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable | None, entry: T) -> None:
        if key is None:
            return
        self._entries[key] = entry
        if len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
