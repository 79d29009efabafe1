"""Counting what took effect, once: every entry of an applied commit under its one outcome,
the live quality of the labelled sessions, latency, state resets and the stage times.

Only applied commits are counted, each once: one whose reply was lost is counted when Redis
shows it applied (Consumer._settle, Partition.settled_by), one that an earlier send applied
on the `applied` reply to its resend.
"""

from __future__ import annotations

import time

import numpy as np

from worker.engine.adapters.commit import CommitResult
from worker.engine.adapters.histograms import FEW_VALUES
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import OUTCOMES, Commit
from worker.engine.compute.quality import LiveQuality
from worker.engine.compute.user_states import UserStates


def ages(now: float, arrival_ms: np.ndarray) -> np.ndarray | list[float]:
    """Seconds from each arrival to `now`, 0 at least; a list for a few (at low traffic
    numpy's calls cost more than the values)."""
    if len(arrival_ms) <= FEW_VALUES:
        return [max(0.0, now - ms / 1000.0) for ms in arrival_ms.tolist()]
    return np.maximum(0.0, now - arrival_ms / 1000.0)


class Tally:
    """One worker's counts of applied commits, into its metrics and live quality."""

    def __init__(self, metrics: WorkerMetrics, quality: LiveQuality) -> None:
        self.metrics = metrics
        self.quality = quality
        for role in ("current", "shadow"):  # computed at scrape time
            metrics.live_auc.labels(role).set_function(lambda r=role: quality.auc(r))
        # each label's child found once, not at every batch (a `labels` lookup costs
        # several µs, a dozen a batch: at low traffic a batch is an event or two)
        self._events = {outcome: metrics.events.labels(outcome) for outcome in OUTCOMES}
        self._seconds = {stage: metrics.batch_seconds.labels(stage)
                         for stage in ("parse", "state", "model", "commit")}  # fmt: skip

    def commit(self, commit: Commit) -> None:
        """Count a commit that took effect: every entry once, under its one outcome."""
        m, now = self.metrics, time.time()
        for outcome, counter in self._events.items():
            if commit.outcomes[outcome]:
                counter.inc(commit.outcomes[outcome])
        if commit.unknown_types:
            m.unknown_types.inc(commit.unknown_types)
        if commit.resend_overflow:
            m.resend_overflow.inc(commit.resend_overflow)
        for part in commit.parts:  # dead letters, actions, the shadow's, live quality, ...
            part.count(m, self.quality)
        m.latency.observe_many(ages(now, commit.arrival_ms))
        m.last_processed.set(now)

    def batch(
        self, batch: Batch, states: UserStates, commit: Commit, result: CommitResult,
        stages: dict[str, float],
    ) -> None:  # fmt: skip
        """Count a batch whose commit applied: the commit, the states it reset, and the
        seconds of its stages (state, model, commit; parse is the batch's own)."""
        m = self.metrics
        for reason, n in states.resets.items():
            m.state_resets.labels(reason).inc(n)
        # keys of another type the read did not see (the cache held those users' states)
        unseen = result.replaced - states.resets["wrong_type"]
        if unseen > 0:
            m.state_resets.labels("wrong_type").inc(unseen)
        self.commit(commit)
        self._seconds["parse"].observe(batch.parse_seconds)
        for stage, seconds in stages.items():
            (self._seconds.get(stage) or m.batch_seconds.labels(stage)).observe(seconds)
        m.batch_entries.observe(len(batch))
