"""The X-Request-ID /v2 makes up when the caller gives none: a UUID4's 32 hex digits, unique, from random
bytes drawn in pools (api/v2/routes.py), never shared with a forked child."""
from __future__ import annotations

import os
import uuid

from service.api.v2 import routes


def _made_up(count: int) -> list[bytes]:
    return [routes.request_id_of({"headers": []}) for _ in range(count)]


def test_made_up_ids_are_distinct_uuid4s_across_pools():
    ids = _made_up(3 * routes._ID_POOL + 7)
    assert len(set(ids)) == len(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid.decode())
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and parsed.hex.encode() == rid


def test_a_caller_id_is_kept_and_a_bad_one_replaced():
    assert routes.request_id_of({"headers": [(b"x-request-id", b"r-1")]}) == b"r-1"
    assert len(routes.request_id_of({"headers": [(b"x-request-id", b"\x01")]})) == 32


def test_a_forked_child_makes_up_other_ids_than_its_parent():
    _made_up(1)  # the parent's pool is drawn: a child must not go on from it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, b"".join(_made_up(8)))
        os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 4096):
        child += chunk
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    parent = b"".join(_made_up(8))
    assert len(child) == len(parent) == 8 * 32 and child != parent
