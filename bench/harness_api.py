"""What a bench module gives ``bench/harness.py``: the interface, in one place.

A bench module takes part in ``make bench`` / ``make bench-smoke`` by defining, at top level::

    def harness(ctx: Context) -> list[Metric]: ...

The harness runs it in a child process of its own (so a crash, a hang or a changed environment
stays there), after it has pointed every Jupyter and IPython folder into ``ctx.root`` and installed
the ivralo kernelspec there (``startup_latency.isolate_jupyter``). The module picks its sizes with
``ctx.pick(smoke=..., full=...)``: smoke sizes run in seconds and only show that the harness works;
full sizes give the numbers in ``bench/README.md``. It returns raw samples, never statistics: the
harness computes every median, p95 and ratio the same way.

Pairing: ``Metric.ivralo[i]`` and ``Metric.baseline[i]`` must come from the same pair of trials,
run back to back (A B, then B A, ...), so that the machine's drift cancels in their ratio; the
harness reports the median of the per-pair ratios. A metric with no baseline (a deadline's overshoot
has no plain-ipykernel counterpart) leaves ``baseline`` as None.

This file is plain data (stdlib only): modules import it without importing jupyter_client.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")

PLAIN_IPYKERNEL = "plain ipykernel"

# Plot families (bench/harness.py draws one PNG per family that has metrics).
LATENCY, OVERSHOOT, MEMORY, CONCURRENCY = "latency", "overshoot", "memory", "concurrency"


@dataclass
class Metric:
    benchmark: str  # the table's first column, e.g. "start", "broker"
    metric: str  # what was timed, e.g. "start to ready"
    unit: str  # "ms", "MiB", ...
    ivralo: list[float]
    baseline: list[float] | None = None  # paired with ``ivralo`` by index
    baseline_label: str = PLAIN_IPYKERNEL
    plot: str | None = None  # one of the plot families above
    level: int | None = None  # CONCURRENCY: how many kernels at once
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "metric": self.metric,
            "unit": self.unit,
            "ivralo": self.ivralo,
            "baseline": self.baseline,
            "baseline_label": self.baseline_label,
            "plot": self.plot,
            "level": self.level,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Metric:
        return cls(**data)


@dataclass
class Context:
    size: str  # "smoke" or "full"
    root: Path  # a private temporary folder, removed after the module ran
    kernel_log: IO[bytes]  # where the kernels' stdout/stderr go (ipykernel's TCP warning, tracebacks)
    timeout: float = 60.0  # seconds a kernel gets to become ready, or a cell to finish
    notes: list[str] = field(default_factory=list)  # shown under the summary table

    @property
    def smoke(self) -> bool:
        return self.size == "smoke"

    def pick(self, smoke: T, full: T) -> T:
        return smoke if self.smoke else full

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)


Harness = Callable[[Context], list[Metric]]
