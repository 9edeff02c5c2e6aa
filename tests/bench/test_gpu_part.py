"""bench/gpu.py (``python -m bench --only gpu``) on the test device: where torch sees no CUDA device its
columns say why and vkact's own figures are measured all the same (the lavapipe dry run of
scripts/gpu-run.sh relies on it); its section replaces only the gpu section of its own device."""
from __future__ import annotations

import numpy as np
import pytest

from bench import gpu, report, torch_cuda_peer
from service.engine import Engine


@pytest.fixture(scope="module")
def result() -> gpu.Result:
    engine = Engine()
    try:
        return gpu.measure(engine, ["relu", "softmax", "parameterized_relu"], 12, repeat=2, warmup=1)
    finally:
        engine.close()


def test_measures_vkact_without_a_cuda_peer(result: gpu.Result) -> None:
    torch, why = torch_cuda_peer.status()
    if torch is not None:
        pytest.skip(f"torch sees a CUDA device here: {why}")
    labels = [r.label for r in result.rows]
    # two-input operators are left out; the softmax family at each row length that fits in 2^12 elements
    assert labels == ["relu", "softmax/1024"]
    relu = result.rows[0]
    assert relu.ulp == 0 and relu.torch is None and relu.torch_why == why
    assert len(relu.kernel.seconds) == len(relu.copy.seconds) == 2
    assert set(result.end_to_end) == {"relu", "softmax/1024"}


def test_ulp_counts_a_wrong_output(result: gpu.Result) -> None:
    x = np.linspace(-4, 4, 1 << 12, dtype=np.float32)
    good = np.maximum(x, 0)
    assert gpu._ulp("relu", None, x, good) == 0
    bad = good.copy()
    bad[100] = np.nextafter(bad[100], np.float32(np.inf))
    bad[3000] = np.nextafter(np.nextafter(bad[3000], np.float32(-np.inf)), np.float32(-np.inf))
    assert gpu._ulp("relu", None, x, bad) == 2


def test_section_replaces_only_its_own(result: gpu.Result) -> None:
    text = gpu.section("Dev A", [("Device", "Dev A")], [result])
    assert "| relu |" in text and "softmax/1024" in text
    other = gpu.section("Dev B", [("Device", "Dev B")], [result])
    merged = report.merge(report.merge("", "Dev A", text, "gpu"), "Dev B", other, "gpu")
    again = report.merge(merged, "Dev A", text.replace("| relu |", "| relu again |"), "gpu")
    assert again.count("<!-- gpu: Dev A -->") == 1 and again.count("<!-- gpu: Dev B -->") == 1
    assert "| relu again |" in again and again.count("| relu |") == 1   # Dev B's row kept, Dev A's replaced


def test_a_run_keeps_what_was_written_by_hand(result: gpu.Result) -> None:
    """The preamble and the analyses between and after sections stay byte for byte; only the section goes."""
    text = gpu.section("Dev A", [("Device", "Dev A")], [result])
    other = gpu.section("Dev B", [("Device", "Dev B")], [result])
    hand = "# results\n\nA preamble edited by hand.\n\n" + text + "\n### What Dev A's run found\n\nBy hand.\n\n" + other + "\nLast words.\n"
    again = report.merge(hand, "Dev A", text.replace("| relu |", "| relu again |"), "gpu")
    assert again == hand.replace(text.rstrip("\n"), text.replace("| relu |", "| relu again |").rstrip("\n"), 1)
    added = report.merge(hand, "Dev A", text.replace("<!-- gpu: Dev A -->", "<!-- graphs: Dev A -->").replace("<!-- end gpu -->", "<!-- end graphs -->"), "graphs")
    # after Dev A's section and what was written about it, before Dev B's
    assert added.startswith(hand[:hand.index("<!-- gpu: Dev B -->")] + "<!-- graphs: Dev A -->")
    assert added.endswith(hand[hand.index("<!-- gpu: Dev B -->"):])
    assert report.merge("", "Dev A", text, "gpu").startswith(report.PREAMBLE)
