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


def pytest_configure(config: pytest.Config) -> None:
    # scripts/test-portability.sh deselects these (-m "not driver_independent"): make test runs them
    config.addinivalue_line(
        "markers",
        "driver_independent: what the test asserts cannot differ between Vulkan drivers, memory modes or the "
        "validation layer (its requests are refused or cut before a kernel runs: transport, parsing, limits, "
        "process supervision; or it starts no device), so the portability run gains nothing by repeating it",
    )


# Every engine and conformance test runs in each of these memory modes (VKACT_TEST_MEMORY, comma-
# separated): host (mapped buffers the shaders use directly, CPUs and integrated GPUs) and device
# (device-local buffers behind staging copies, the discrete-GPU path).
MEMORY_MODES = [m for m in os.environ.get("VKACT_TEST_MEMORY", "host,device").split(",") if m]


@pytest.fixture(scope="session", params=MEMORY_MODES)
def memory(request: pytest.FixtureRequest) -> str:
    """The memory mode (Settings.memory) that the engine tests run in."""
    return request.param


@pytest.fixture(scope="session")
def engine(memory: str) -> Iterator["Engine"]:
    """One engine per memory mode on the default device (lavapipe here, VKACT_DEVICE / VK_ICD_FILENAMES
    choose another) for the session, shaders loaded up front."""
    from service.config import Settings  # imported here: the client tests need no kp
    from service.engine import Engine

    e = Engine(Settings(memory=memory))
    e.load_shaders()
    yield e
    e.close()
