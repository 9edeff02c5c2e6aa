from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from service.engine import Engine


@pytest.fixture(scope="session")
def engine() -> Iterator["Engine"]:
    """One engine on the default device (lavapipe here) for the session, shaders loaded up front."""
    from service.engine import Engine  # imported here: the client tests need no kp

    e = Engine()
    e.load_shaders()
    yield e
    e.close()
