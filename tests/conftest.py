from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

# In CI the property tests replay the same examples on every run (reproducible); locally they explore.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

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
