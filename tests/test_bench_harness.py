"""bench/harness.py's statistics and its list of modules (make bench-smoke, in CI, runs the modules)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402 - bench/ is not a package
from harness_api import Metric  # noqa: E402


def test_ratio_is_the_median_of_per_pair_ratios() -> None:
    # Drift: the second pair ran on a slower machine. Each pair's ratio is 2; the ratio of the
    # medians would not be.
    metric = Metric("b", "m", "ms", ivralo=[2.0, 20.0, 4.0], baseline=[1.0, 10.0, 2.0])
    stats = harness.statistics_of(metric)
    assert stats["ratio_median_of_pairs"] == 2.0
    assert stats["ivralo_median"] == 4.0 and stats["baseline_median"] == 2.0
    assert stats["pairs"] == 3


def test_a_metric_without_a_baseline_has_no_ratio() -> None:
    stats = harness.statistics_of(Metric("deadline", "overshoot", "ms", ivralo=[1.0, 2.0, 3.0, 4.0, 5.0]))
    assert "ratio_median_of_pairs" not in stats
    assert math.isclose(stats["ivralo_p95"], 4.8)
    assert "| - | - | - |" in harness.markdown_table([{"metric": Metric("d", "o", "ms", [1.0]), "stats": stats}])[2]


def test_every_listed_module_that_exists_defines_harness() -> None:
    for name, _ in harness.MODULES:
        path = BENCH / f"{name}.py"
        if path.exists():  # the DataFrame transport slot may be empty: the run skips it
            assert re.search(r"^def harness\(", path.read_text(), re.MULTILINE), name
