"""The live quality part: per scoring model (the current, the shadow), the (score, label)
samples of the sessions this batch labelled or ended, added to the windowed AUC once the
commit applied (compute/quality.py).

The samples write nothing in the transaction, so they are worked out when first asked: once
the commit applied (`count`), not on the way to its EXEC. At low traffic every step of a
round runs on cold caches, and this one cost ~80 µs of the wait for a score."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from model.artifact import label_type_of
from worker.engine.compute.parts.part import Part, Share
from worker.engine.compute.quality import label_samples
from worker.engine.compute.stages import ModelRun, Run, gap_ms

Samples = dict[str, tuple[np.ndarray, np.ndarray]]  # per model role: (scores, labels)
_NO_SAMPLES = (np.zeros(0), np.zeros(0, bool))  # a group's other shares' (never written to)


@dataclass
class Quality(Part):
    """Labelled-session samples (scores, labels) per model role, worked out by `pending` when
    first asked (its inputs: the batch's run, which nothing changes once built)."""

    roles: tuple[str, ...]
    pending: Callable[[], Samples] = field(compare=False, repr=False)

    @cached_property
    def samples(self) -> Samples:
        return self.pending()

    def count(self, metrics: Any, quality: Any) -> None:
        for role, (scores, labels) in self.samples.items():
            if len(labels):
                quality.add(role, scores, labels)
                metrics.labelled_sessions.labels(role, "positive").inc(int(labels.sum()))
                metrics.labelled_sessions.labels(role, "negative").inc(int((~labels).sum()))

    def share(self, s: Share) -> Quality:
        if s.first:
            return self
        return Quality(self.roles, lambda: dict.fromkeys(self.roles, _NO_SAMPLES))


def samples_of(run: Run, m: ModelRun) -> tuple[np.ndarray, np.ndarray]:
    """One model's samples, from its scores and its users' last scores before the batch."""
    label = label_type_of(m.model.model)
    return label_samples(run.k_slot, run.types, run.ts, m.scores, m.score_before, run.ts_before,
                         run.states.recent, label, gap_ms(m.model))  # fmt: skip


def quality_stage(run: Run, runs: list[ModelRun]) -> Quality:
    """The stage: every scoring model's samples, by role, when first asked."""
    return Quality(tuple(m.role for m in runs), lambda: {m.role: samples_of(run, m) for m in runs})
