"""A large body kept as its chunks (service/api/chunked_body.py): any slice of it, gathered into a slot,
is the bytes the joined body holds there, zero-padded to the descriptor's size."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.api.chunked_body import LARGE, Chunks


def split(data: bytes, rng: np.random.Generator) -> list[bytes]:
    cuts = sorted(rng.choice(np.arange(1, len(data)), size=min(40, len(data) - 1), replace=False))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@pytest.mark.parametrize("size", [97, 4096, LARGE + 13])  # the last is filled in a thread
def test_every_slice_of_the_chunks_is_the_joined_bytes(size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, size, np.uint8).tobytes()
    body = Chunks(split(data, rng))
    assert len(body) == size and body.head(min(50, size)) == data[:50]
    assert bytes(asyncio.run(body.joined())) == data
    for start, n in [(0, size), (1, size - 1), (size // 3, size // 2), (size - 1, 1)]:
        pad = (-n) % 4
        slot = np.full(n + pad + 8, 0xEE, np.uint8)  # bytes past the input's buffer stay as they were
        asyncio.run(body.source(start, n, n + pad).fill(slot[: n + pad]))
        assert slot[:n].tobytes() == data[start : start + n]
        assert not slot[n : n + pad].any() and (slot[n + pad :] == 0xEE).all()
