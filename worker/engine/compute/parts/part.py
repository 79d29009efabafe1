"""A commit's part: one feature's share of what a batch writes and counts.

A Commit (compute/pipeline.py) is the core every batch writes (score entries, states, the
position) plus the parts its features computed (dead letters, actions, the shadow's scores,
item memories, live quality, input counts). Each part says what it adds to the commit's one
transaction and to the counts, through the hooks below; the committer (adapters/commit.py)
and the tally (engine/tally.py) ask every part and know none by name. A new sink is one
part module plus its registration in compute/pipeline.py (`STAGES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from worker.common.keys import Keys
from worker.engine.compute.batch import Batch


@dataclass(frozen=True)
class Rows:
    """Commands laid out from columns, one per row of its columns (a template of
    adapters/resp.py's `resp_commands`: lists are columns, other items constants)."""

    template: list
    n: int  # commands, the columns' length


# One command: its arguments, packed as they are.
Command = tuple


@dataclass(frozen=True)
class Share:
    """One batch's share of a Commit computed for a group of batches (compute/joint.py): its
    batch, its state rows and score rows in the group's, and whether it is the group's first,
    which carries the counts that are the group's sums."""

    batch: Batch
    rows: slice
    scores: slice
    first: bool


class Part:
    """One feature's share of a commit; a hook it does not need adds nothing."""

    def watched(self, keys: Keys, p: int) -> list[str]:
        """The streams it writes: WATCHed with the commit's checks, their types checked."""
        return []

    def writes(self, keys: Keys, p: int, limits: Any) -> list[Command | Rows]:
        """Its commands before the partition's position (stream entries, their trims);
        `limits` is the committer's CommitLimits."""
        return []

    def score_fields(self) -> list:
        """Fields added to every score entry: names and per-entry columns."""
        return []

    def state_fields(self, rewrite: bool) -> list:
        """Fields added to every state's HSET (full layout): names and per-state columns;
        `rewrite`: some state keys are rewritten whole."""
        return []

    def state_writes(self, keys: list[str]) -> list[list]:
        """Commands per state row after its HSET: templates over the state keys."""
        return []

    def count(self, metrics: Any, quality: Any) -> None:
        """Count what it wrote, once the commit applied (WorkerMetrics, LiveQuality)."""

    def share(self, s: Share) -> Part:
        """Its part of one batch's Commit, from a group's (compute/joint.py): its rows'
        writes exactly, counts that are sums on the group's first batch alone."""
        raise NotImplementedError(f"{type(self).__name__} does not say how a group's splits")


def decimals(values: np.ndarray) -> list[str]:
    """Floats as decimal strings, 9 significant digits (float32 round-trips)."""
    return list(map("{:.9g}".format, values.tolist()))
