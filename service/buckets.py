"""Capacity buckets shared by the engine's buffer pool and the worker's shared-memory slots."""
from __future__ import annotations

MIN_BUCKET = 4096


def bucket(nbytes: int) -> int:
    """Capacity for ``nbytes``: 4 KiB, or four steps per power of two above it (at most 25% unused)."""
    if nbytes <= MIN_BUCKET:
        return MIN_BUCKET
    step = 1 << max((nbytes - 1).bit_length() - 3, 0)
    return -(-nbytes // step) * step
