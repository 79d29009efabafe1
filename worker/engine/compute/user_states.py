"""The states of a batch's distinct users as read (or cached) before the batch: the current
model's, and the shadow model's beside them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from worker.engine.compute.batch import Batch
from worker.engine.compute.deferred import Deferred

NO_HISTORY = b""  # a packed history with no events (compute/recent.py)


@dataclass
class ShadowStates:
    """The shadow model's own states of the batch's users (champion/challenger)."""

    h: np.ndarray  # (U, L', H') float32
    last_ts: np.ndarray  # (U,) int64, a copy: the main model's advance moves its own
    replay: list[int] = field(default_factory=list)  # rows to rebuild from `recent` first
    score: np.ndarray | None = None  # (U,) its last score of each user, NaN = none
    rules: list[bytes] = field(default_factory=list)  # its rule states (`shadow_rules`)


@dataclass
class UserStates:
    """The states of a batch's distinct users, as read (or cached) before the batch."""

    users: list[str]
    h: np.ndarray  # (U, L, H) float32, advanced in place by the pipeline
    last_ts: np.ndarray  # (U,) int64 epoch ms of the last applied event; -1 = none
    last_id: list[tuple[int, int]]  # entry id of the last applied event; (-1, -1) = none
    n: np.ndarray  # (U,) int64 events applied
    event_ids: list[bytes]  # last applied producer event ids, oldest first, space-separated
    seq: bytes  # the partition's commit sequence the states were read at
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (U,) last score, NaN = none
    recent: list[bytes] = field(default_factory=list)  # the users' recent events, packed
    rules: list[bytes] = field(default_factory=list)  # the users' rule states, b"" = none
    items: list[bytes] = field(default_factory=list)  # the users' item memories, b"" = none
    replay: list[int] = field(default_factory=list)  # rows to rebuild from `recent` first
    resets: Counter[str] = field(default_factory=Counter)  # states restarted, by reason
    shadow: ShadowStates | None = None  # when a shadow model scores beside the current
    # rows whose stored hash holds the other layout's fields (docs/contract.md, The lean
    # layout): their commit rewrites the key whole
    rewrite: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, users: list[str], shape: tuple[int, int], seq: bytes = b"") -> UserStates:
        """Fresh states: zero h, no history."""
        n = len(users)
        return cls(
            users=users,
            h=np.zeros((n, *shape), np.float32),
            last_ts=np.full(n, -1, np.int64),
            last_id=[(-1, -1)] * n,
            n=np.zeros(n, np.int64),
            event_ids=[b""] * n,
            seq=seq,
            score=np.full(n, np.nan),
            recent=[NO_HISTORY] * n,
            rules=[b""] * n,
            items=[b""] * n,
        )

    def rows(self, start: int, stop: int) -> UserStates:
        """The users start..stop as states of their own: views of these arrays (the pipeline's
        advance of one moves the other), the row lists renumbered, no resets, this seq."""
        shadow = self.shadow
        if shadow is not None:
            shadow = ShadowStates(
                shadow.h[start:stop], shadow.last_ts[start:stop], _renumbered(shadow.replay,
                start, stop), None if shadow.score is None else shadow.score[start:stop],
                shadow.rules[start:stop],
            )  # fmt: skip
        return UserStates(
            users=self.users[start:stop], h=self.h[start:stop], last_ts=self.last_ts[start:stop],
            last_id=self.last_id[start:stop], n=self.n[start:stop],
            event_ids=self.event_ids[start:stop], seq=self.seq, score=self.score[start:stop],
            recent=self.recent[start:stop], rules=self.rules[start:stop],
            items=self.items[start:stop], replay=_renumbered(self.replay, start, stop),
            shadow=shadow, rewrite=_renumbered(self.rewrite, start, stop),
        )  # fmt: skip

    def view(self, start: int, stop: int, seq: bytes) -> UserStates:
        """`rows(start, stop)` at sequence `seq`, made with the users and the resets only; the
        rest is sliced on first use (compute/deferred.py): a round's group reads no more of
        a batch's states before its commit than its users, sequence and resets."""
        head = {"users": self.users[start:stop], "seq": seq, "resets": Counter()}
        return StatesView.made(head, partial(_rest_of_rows, self, start, stop))


class StatesView(Deferred, UserStates):
    """A batch's rows of a node's round's states (`UserStates.view`)."""


def _rest_of_rows(states: UserStates, start: int, stop: int) -> dict:
    """The fields of `rows(start, stop)` that a view defers."""
    rows = vars(states.rows(start, stop))
    return {k: v for k, v in rows.items() if k not in ("users", "seq", "resets")}


def _renumbered(rows: list[int], start: int, stop: int) -> list[int]:
    """The rows within start..stop, counted from start."""
    return [r - start for r in rows if start <= r < stop] if rows else []


def user_slots(batch: Batch, users: list[str]) -> np.ndarray:
    """For each valid event of the batch, the row of its user in `users`."""
    row = dict(zip(users, range(len(users)), strict=True))
    return np.fromiter(map(row.__getitem__, batch.users), np.int64, len(batch.users))


def distinct_users(batch: Batch) -> list[str]:
    """The batch's users, each once, in order of first appearance."""
    return list(dict.fromkeys(batch.users))
