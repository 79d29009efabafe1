"""The live quality part: per scoring model (the current, the shadow), the (score, label)
samples of the sessions this batch labelled or ended, added to the windowed AUC once the
commit applied (compute/quality.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from model.artifact import label_type_of
from worker.engine.compute.parts.part import Part, Share
from worker.engine.compute.quality import label_samples
from worker.engine.compute.stages import ModelRun, Run, gap_ms


@dataclass
class Quality(Part):
    """Labelled-session samples (scores, labels) per model role."""

    samples: dict[str, tuple[np.ndarray, np.ndarray]]

    def count(self, metrics: Any, quality: Any) -> None:
        for role, (scores, labels) in self.samples.items():
            if len(labels):
                quality.add(role, scores, labels)
                metrics.labelled_sessions.labels(role, "positive").inc(int(labels.sum()))
                metrics.labelled_sessions.labels(role, "negative").inc(int((~labels).sum()))

    def share(self, s: Share) -> Quality:
        if s.first:
            return self
        return Quality({role: (scores[:0], labels[:0]) for role, (scores, labels)
                        in self.samples.items()})  # fmt: skip


def samples_of(run: Run, m: ModelRun) -> tuple[np.ndarray, np.ndarray]:
    """One model's samples, from its scores and its users' last scores before the batch."""
    label = label_type_of(m.model.model)
    return label_samples(run.k_slot, run.types, run.ts, m.scores, m.score_before, run.ts_before,
                         run.states.recent, label, gap_ms(m.model))  # fmt: skip


def quality_stage(run: Run, runs: list[ModelRun]) -> Quality:
    """The stage: every scoring model's samples, by role."""
    return Quality({m.role: samples_of(run, m) for m in runs})
