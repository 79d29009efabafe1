"""The input counts part: per declared input of the current model, how many of the batch's
scored events had its value missing or bad (`intentstream_input_values_total`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.engine.compute.parts.part import Part, Share
from worker.engine.compute.stages import ModelRun, Run


@dataclass
class InputCounts(Part):
    """(missing, bad) values per declared input."""

    counts: dict[str, tuple[int, int]]

    def count(self, metrics: Any, quality: Any) -> None:
        for name, (missing, bad) in self.counts.items():
            if missing:
                metrics.input_values.labels(name, "missing").inc(missing)
            if bad:
                metrics.input_values.labels(name, "bad").inc(bad)

    def share(self, s: Share) -> InputCounts:
        return self if s.first else InputCounts(dict.fromkeys(self.counts, (0, 0)))


def input_counts_stage(run: Run, runs: list[ModelRun]) -> InputCounts:
    """The stage: the current model's counts of its last advance."""
    return InputCounts(runs[0].input_counts)
