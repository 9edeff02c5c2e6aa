"""bench/vulkan_peers.py and the kernel section's Vulkan peers table: the accuracy measure against the
tests' own ulp distance, peers that are missing, refuse the device or fail on an operator (the
column says why; nothing raises), and the target's verdict. No peer package is needed."""
from __future__ import annotations

import numpy as np
import pytest

from bench import report, vulkan_peers
from bench.report import OpResult, SizeResult
from bench.timing import Samples
from bench.vulkan_peers import Bound, PeerRun
from tests.helpers import ulp_distance


def test_max_ulp_is_the_largest_ulp_distance():
    rng = np.random.default_rng(0)
    want = (rng.standard_normal(10_000) * 10).astype(np.float32)
    got = want.copy()
    got[::7] = np.nextafter(got[::7], np.float32(np.inf))
    got[3] = np.nextafter(np.nextafter(np.nextafter(want[3], np.float32(0)), np.float32(0)), np.float32(0))
    assert vulkan_peers.max_ulp(got, want) == int(ulp_distance(got, want).max()) == 3


def test_max_ulp_signed_zeros_nan_and_flushed_subnormals():
    tiny = np.finfo(np.float32).tiny
    want = np.array([0.0, -0.0, np.nan, tiny / 4, 1.0], np.float32)
    got = np.array([-0.0, 0.0, np.nan, 0.0, 1.0], np.float32)
    assert vulkan_peers.max_ulp(got, want) == 0
    assert vulkan_peers.max_ulp(np.array([np.nan], np.float32), np.array([1.0], np.float32)) == 1 << 31
    assert vulkan_peers.max_ulp(np.array([-1.0], np.float32), np.array([1.0], np.float32)) == 2 * 0x3F800000


class _Peer:
    def __init__(self, name: str, version: str | None = "1.0", refuse: str | None = None, bound: object = None) -> None:
        self.name, self._version, self._refuse, self._bound = name, version, refuse, bound

    def version(self) -> str | None:
        return self._version

    def open(self, device_name: str) -> str | None:
        if self._refuse == "raise":
            raise RuntimeError("no Vulkan loader")
        return self._refuse

    def bind(self, name, op, x):
        if isinstance(self._bound, Exception):
            raise self._bound
        return self._bound


def test_missing_refusing_and_failing_peers_say_why(monkeypatch):
    x = np.arange(8, dtype=np.float32)
    good = Bound(run=lambda: None, output=lambda: x + np.float32(0))
    peers = [_Peer("ncnn", version=None), _Peer("wgpu", refuse="raise"), _Peer("IREE", bound=good),
             _Peer("other", refuse="sees another device")]
    monkeypatch.setattr(vulkan_peers, "_peers", lambda: peers)
    opened = vulkan_peers.open_peers("dev")
    assert [p.name for p in opened.peers] == ["IREE"]
    assert "not installed" in opened.status["ncnn"]
    assert "RuntimeError: no Vulkan loader" in opened.status["wgpu"]
    assert opened.status["other"] == "1.0: sees another device"

    bound, runs = vulkan_peers.bind(opened, "relu", None, x, x)
    assert list(bound) == ["IREE"] and runs["IREE"].ulp == 0
    assert runs["ncnn"].seconds is None and "not installed" in runs["ncnn"].why

    for result, why in ((None, "no like-for-like kernel"), (ValueError("bad\nmore"), "failed: ValueError: bad")):
        opened.peers[0]._bound = result
        bound, runs = vulkan_peers.bind(opened, "relu", None, x, x)
        assert bound == {} and runs["IREE"].why == why


def test_a_baseline_is_taken_off_round_by_round():
    calls: list[str] = []
    b = Bound(run=lambda: calls.append("run"), output=lambda: np.zeros(1, np.float32), baseline=lambda: calls.append("base"), per=4)
    assert [key for key, _ in vulkan_peers.tasks({"ncnn": b})] == [("baseline", "ncnn"), ("run", "ncnn")]
    timed = {("run", "ncnn"): Samples([1.0, 2.0]), ("baseline", "ncnn"): Samples([0.2, 0.4])}
    runs = vulkan_peers.collect({"ncnn": b}, {"ncnn": PeerRun(ulp=1)}, timed)
    assert runs["ncnn"].seconds.seconds == pytest.approx([0.2, 0.4])
    assert runs["ncnn"].ratio(Samples([0.1, 0.1])) == pytest.approx(3.0)   # median of 2 and 4


def _op(name: str, vkact: list[float], **peers: list[float] | str) -> OpResult:
    runs = {p: PeerRun(why=t) if isinstance(t, str) else PeerRun(Samples(t), ulp=5) for p, t in peers.items()}
    return OpResult(name, Samples(vkact), Samples(vkact), Samples(vkact), vulkan=runs, ulp=1)


def test_verdict_names_each_operator_a_peer_beats():
    fast = SizeResult(20, 8 << 20, Samples([1.0]), [
        _op("relu", [1.0, 1.0], ncnn=[2.0, 2.0], wgpu=[3.0, 3.0]),
        _op("gelu", [1.0, 1.0], ncnn=[0.5, 0.9], wgpu="no like-for-like kernel"),
        _op("softmax/1024", [1.0, 1.0]),
    ])
    verdict = report.vulkan_verdict([fast])
    assert verdict.startswith("met on 1 of 2 operators shared; **NOT met** on `gelu` (ncnn 0.70 at 2^20)")
    assert report.vulkan_verdict([SizeResult(24, 1, Samples([1.0]), [fast.ops[0]])]) == "**met** on all 1 operators shared"

    text = report.section("dev", [], [fast], ["numpy"], targets=True)
    table = text.split("Vulkan peers on the same device")[1]
    gelu = next(line for line in table.splitlines() if line.startswith("| `gelu` |"))
    # vkact 1 ms, ulp 1; ncnn 0.70 ms, beats vkact (bold), 5 ulp; wgpu and IREE: no figures
    assert gelu == "| `gelu` | 1000.00 | 1 | 700.00 | **0.70** | 5 | — | — | — | — | — | — |"
    assert "`softmax/1024`" not in table   # no peer shares it
    assert "**Target**" in text and "**Target**" not in report.section("dev", [], [fast], ["numpy"], targets=False)
