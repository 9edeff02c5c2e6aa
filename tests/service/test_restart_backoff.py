"""The restart delay the supervisor (its HTTP server) and the HTTP process (its device worker) share
(service/restart_backoff.py), against the sequences README's failure section gives: doubling with each
death in a row of a process that had not run STABLE_S, capped, and back to the first after one that had."""
from __future__ import annotations

import pytest

from service.restart_backoff import STABLE_S, RestartBackoff
from service.supervisor import FIRST_BACKOFF_S, MAX_BACKOFF_S
from service.worker_lifecycle import FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S

pytestmark = pytest.mark.driver_independent  # no device: make test runs it, test-portability.sh leaves it out

QUICK, STABLE = 1.0, STABLE_S  # seconds a process ran before it died


def _delays(backoff: RestartBackoff, ran: list[float | None]) -> list[float]:
    return [backoff.after_death(r, STABLE_S) for r in ran]


def test_the_device_worker_delays_double_to_5_s_and_start_again_after_a_stable_worker():
    backoff = RestartBackoff(FIRST_RESTART_DELAY_S, MAX_RESTART_DELAY_S)
    assert _delays(backoff, [QUICK] * 8) == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    assert backoff.quick_exits == 8
    assert _delays(backoff, [STABLE, QUICK, None, STABLE + 1]) == [0.2, 0.4, 0.8, 0.2]  # None: never reported
    assert backoff.quick_exits == 0


def test_the_http_server_delays_double_to_30_s_and_count_quick_exits_for_the_supervisor_to_stop_at():
    backoff = RestartBackoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
    assert _delays(backoff, [QUICK] * 7) == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert _delays(backoff, [STABLE]) == [0.5]
    assert backoff.quick_exits == 0  # a stable exit is not counted towards QUICK_EXITS
    assert _delays(backoff, [QUICK, QUICK]) == [1.0, 2.0] and backoff.quick_exits == 2


def test_the_measure_of_stable_is_the_callers():
    backoff = RestartBackoff(1.0, 8.0)
    assert _delays(backoff, [QUICK, QUICK]) == [1.0, 2.0]
    assert backoff.after_death(QUICK, QUICK) == 1.0  # what ran as long as stable_s says is stable
