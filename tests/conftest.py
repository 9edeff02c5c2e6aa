from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.engine import Engine


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """One engine on the default device (lavapipe here) for the session, shaders loaded up front."""
    e = Engine()
    e.load_shaders()
    yield e
    e.close()
