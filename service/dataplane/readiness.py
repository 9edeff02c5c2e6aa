"""Readiness, in one place: the device worker has reported ready (device created, every shader loaded).
Health probes, model readiness, the repository index, gRPC's health service and each inference ask here."""
from __future__ import annotations

from typing import Any

from ..errors import NotReady
from ..worker import DeviceWorker

NOT_READY = "the device is not ready yet"


def is_ready(worker: DeviceWorker | None) -> bool:
    """Whether inferences can run now (probes answer by it and never wait for the device)."""
    return worker is not None and worker.ready


def ready_device(worker: DeviceWorker | None) -> dict[str, Any]:
    """The ready worker's report (device, limits) for an inference; NotReady (503) while it is not."""
    if worker is None or not worker.ready or worker.info is None:
        raise NotReady(NOT_READY)
    return worker.info


def device_report(worker: DeviceWorker) -> dict[str, Any]:
    """The last report of the device (GET /v1/device answers it while a restarted worker starts)."""
    if worker.info is None:
        raise NotReady(NOT_READY)
    return worker.info
