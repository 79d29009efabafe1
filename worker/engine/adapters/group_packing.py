"""A group's commits (compute/joint.py) packed at once: each command template laid out over
the group's rows once, its commands shared out among the commits.

At low traffic a round's group is a few commits of an event or two; packed one by one, each
paid every template's fixed cost (its columns converted, its layout scanned), most of the
packing's time. Each commit's writes are byte for byte what Committer.prepare gives it
alone (the test compares), so its transaction, its replies and its outcome are as before.
"""

from __future__ import annotations

import numpy as np

from worker.engine.adapters.commit import Committer, PreparedCommit
from worker.engine.adapters.resp import packed_rows
from worker.engine.adapters.row_writes import scores_template, state_templates
from worker.engine.compute.joint import Group
from worker.engine.compute.parts.part import Share, decimals
from worker.engine.compute.pipeline import Commit

# More rows than this: each commit is packed alone (its framers' kernels pay off)
GROUP_ROWS = 32


def prepared_group(committer: Committer, group: Group) -> list[PreparedCommit] | None:
    """Each commit's PreparedCommit, as committer.prepare gives it alone; None when the
    group is packed commit by commit (more than GROUP_ROWS rows, or commits whose state
    fields differ: some with keys rewritten whole, some without)."""
    whole = group.whole
    rewrite = {bool(c.rewrite) for c in group.commits}
    if max(len(whole.scores), len(whole.users)) > GROUP_ROWS or len(rewrite) > 1:
        return None
    keys = committer.keys
    text = decimals(whole.scores)
    score_keys = [keys.scores(c.partition) for c, r in zip(group.commits, group.ranges, strict=True)
                  for _ in range(r.scores.start, r.scores.stop)]  # fmt: skip
    xadds = packed_rows(scores_template(whole, text, score_keys, committer.lean))
    state_keys = [keys.state_prefix(c.partition) + u for c in group.commits for u in c.users]
    states = _GroupStates(committer, whole, state_keys, text, rewrite.pop())
    return [_prepared(committer, c, r, xadds, states)
            for c, r in zip(group.commits, group.ranges, strict=True)]  # fmt: skip


class _GroupStates:
    """The group's state writes, a command per state row of each kind: the DELs of the keys
    rewritten whole, the HSETs, the parts' (the shadow's), the TTLs."""

    def __init__(
        self, committer: Committer, whole: Commit, keys: list[str], text: list[str],
        rewrite: bool,
    ) -> None:  # fmt: skip
        self.stamped, self.hsets, self.lean = [], [], True
        self.rewrite, self.dels, self.extras = whole.rewrite, {}, []
        if keys:  # else every commit writes no state (`of`)
            self._pack(committer, whole, keys, text, rewrite)

    def _pack(
        self, committer: Committer, whole: Commit, keys: list[str], text: list[str],
        rewrite: bool,
    ) -> None:  # fmt: skip
        with_ids, without = state_templates(whole, keys, text, rewrite, committer.lean)
        every = range(len(keys))
        # the full layout writes event_ids only where there are any (Committer._states)
        self.stamped = [True] * len(keys) if without is None else list(map(bool, whole.event_ids))
        self.hsets: list[bytes] = [b""] * len(keys)
        for template, stamped in ((with_ids, True), (without, False)):
            if template is not None:
                rows = [r for r in every if self.stamped[r] == stamped]
                for r, command in zip(rows, packed_rows(template, rows), strict=True):
                    self.hsets[r] = command
        self.lean = without is None
        self.dels = dict(zip(whole.rewrite, packed_rows(["DEL", keys], whole.rewrite), strict=True))
        self.extras = [packed_rows(t) for part in whole.parts for t in part.state_writes(keys)]
        if committer.limits.state_ttl_ms > 0:
            self.extras.append(packed_rows(["PEXPIRE", keys, committer.limits.state_ttl_ms]))

    def of(self, rows: slice) -> tuple[list[bytes], int, int, np.ndarray]:
        """One commit's state writes (its rows): as row_writes.state_writes gives them."""
        if rows.start == rows.stop:
            return [], 0, 0, np.zeros(0, np.int64)
        mine = range(rows.start, rows.stop)
        dels = [self.dels[r] for r in self.rewrite if rows.start <= r < rows.stop]
        order = list(mine) if self.lean else (
            [r for r in mine if self.stamped[r]] + [r for r in mine if not self.stamped[r]]
        )  # fmt: skip
        out = [*dels, *(self.hsets[r] for r in order)]
        for extra in self.extras:
            out += extra[rows]
        n = len(dels) + len(mine) * (1 + len(self.extras))
        return out, n, len(dels), np.asarray(order, np.int64) - rows.start


def _prepared(
    committer: Committer, c: Commit, r: Share, xadds: list[bytes], states: _GroupStates
) -> PreparedCommit:
    """One commit's writes in Committer.prepare's order, from the group's commands."""
    return committer.prepared(c, xadds[r.scores], states.of(r.rows))
