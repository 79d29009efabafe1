"""The batch pipeline as a pure function: parsed batch + users' states + model -> a Commit.

No Redis here: `build_commit` decides, for every entry of a batch, its one outcome (scored,
duplicate, deadletter, lost), advances the states of the users it scores with one batched
kernel call, and returns everything the commit writes. worker/commit.py packs and applies
a Commit atomically; worker/states.py reads the UserStates it starts from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from model.scoring import ScoringModel
from worker.batch import Batch, DeadLetter

# A user's last applied producer event ids kept in the state (SPEC §3 "the last few"):
# a producer's retry comes right after its first attempt, so a handful is plenty.
RECENT_EVENT_IDS = 8

OUTCOMES = ("scored", "duplicate", "deadletter", "misrouted", "lost")


@dataclass
class UserStates:
    """The states of a batch's distinct users, as read (or cached) before the batch."""

    users: list[str]
    h: np.ndarray  # (U, L, H) float32, advanced in place by the pipeline
    last_ts: np.ndarray  # (U,) int64 epoch ms of the last applied event; -1 = none
    last_id: list[tuple[int, int]]  # entry id of the last applied event; (-1, -1) = none
    n: np.ndarray  # (U,) int64 events applied
    event_ids: list[list[bytes]]  # last applied producer event ids, oldest first
    seq: bytes  # the partition's commit sequence the states were read at
    resets: Counter[str] = field(default_factory=Counter)  # states restarted, by reason

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
            event_ids=[[] for _ in range(n)],
            seq=seq,
        )


@dataclass
class Commit:
    """Everything one partition batch writes, all or nothing (worker/commit.py)."""

    partition: int
    model: str  # version that computed the states and scores
    seq: bytes  # the commit sequence the states were read at
    ack_ids: list[bytes]  # every entry of the batch, in stream order
    # one row per user state written (users with at least one scored event)
    users: list[str]
    h: np.ndarray  # (K, L, H) float32
    user_scores: np.ndarray  # (K,) float32: the score of the user's last event
    last_ids: list[bytes]  # entry id of the user's last applied event
    last_keys: list[tuple[int, int]]  # the same as (ms, seq)
    last_ts: np.ndarray  # (K,) int64
    n: np.ndarray  # (K,) int64
    event_ids: list[list[bytes]]  # the user's last applied producer event ids
    # one row per score entry, in stream order
    score_user: np.ndarray  # (S,) int64 index into the state rows above
    score_types: list[str]
    scores: np.ndarray  # (S,) float32
    score_ts: np.ndarray  # (S,) int64
    score_event_ids: list[bytes]  # the producer's event id, else the entry id
    arrival_ms: np.ndarray  # (S,) float64 entry id time of each scored event
    dead: list[DeadLetter]
    outcomes: dict[str, int]  # entries per outcome; they sum to len(ack_ids)
    unknown_types: int  # scored events of types the model does not know


def user_slots(batch: Batch, users: list[str]) -> np.ndarray:
    """For each valid event of the batch, the row of its user in `users`."""
    row = {u: i for i, u in enumerate(users)}
    return np.fromiter((row[u] for u in batch.users), np.int64, len(batch.users))


def distinct_users(batch: Batch) -> list[str]:
    """The batch's users, each once, in order of first appearance."""
    return list(dict.fromkeys(batch.users))


def _applied_before(batch: Batch, states: UserStates, slot: np.ndarray) -> np.ndarray:
    """Events whose entry id is above their user's last applied id (SPEC §4)."""
    last = states.last_id
    return np.fromiter(
        (k > last[s] for k, s in zip(batch.entry_keys, slot.tolist(), strict=True)),
        np.bool_,
        len(slot),
    )


def _drop_producer_retries(
    batch: Batch, states: UserStates, slot: np.ndarray, keep: np.ndarray
) -> dict[int, list[bytes]]:
    """Unmark events whose producer event id is among their user's recent ones; return the
    updated recent ids of the users whose list changed."""
    recent: dict[int, list[bytes]] = {}
    for i, event_id in enumerate(batch.event_ids):
        if event_id is None or not keep[i]:
            continue
        s = int(slot[i])
        seen = recent.get(s)
        if seen is None:
            seen = recent[s] = list(states.event_ids[s])
        if event_id in seen:
            keep[i] = False
        else:
            seen.append(event_id)
            del seen[:-RECENT_EVENT_IDS]
    return recent


def build_commit(batch: Batch, states: UserStates, model: ScoringModel) -> Commit:
    """Decide every entry's outcome, advance the states, and return what to commit.

    `states` must hold the batch's distinct users (see `distinct_users`); their h and
    last_ts are advanced in place.
    """
    slot = user_slots(batch, states.users)
    keep = _applied_before(batch, states, slot)
    recent = _drop_producer_retries(batch, states, slot, keep)
    idx = np.flatnonzero(keep)
    k_slot = slot[idx]
    types = [batch.types[i] for i in idx]
    type_idx = model.type_indices(types)
    ts = np.fromiter((batch.ts[i] for i in idx), np.int64, len(idx))
    scores = model.advance(states.h, states.last_ts, k_slot, type_idx, ts)

    # The users written are those with at least one scored event; each state row takes the
    # values of the user's last scored event.
    touched = np.unique(k_slot)
    last_event = np.full(len(states.users), -1, np.int64)
    np.maximum.at(last_event, k_slot, np.arange(len(idx)))
    last_of_user = idx[last_event[touched]]
    row_of_slot = np.zeros(len(states.users), np.int64)
    row_of_slot[touched] = np.arange(len(touched))
    applied = np.bincount(k_slot, minlength=len(states.users))[touched]
    touched_list = touched.tolist()
    outcomes = {
        "scored": len(idx),
        "duplicate": len(batch.users) - len(idx),
        "deadletter": len(batch.dead) - batch.misrouted,
        "misrouted": batch.misrouted,
        "lost": batch.lost,
    }
    return Commit(
        partition=batch.partition,
        model=model.version,
        seq=states.seq,
        ack_ids=batch.ids,
        users=[states.users[s] for s in touched_list],
        h=states.h[touched],
        user_scores=scores[last_event[touched]],
        last_ids=[batch.entry_ids[i] for i in last_of_user.tolist()],
        last_keys=[batch.entry_keys[i] for i in last_of_user.tolist()],
        last_ts=states.last_ts[touched],
        n=states.n[touched] + applied,
        event_ids=[recent.get(s, states.event_ids[s]) for s in touched_list],
        score_user=row_of_slot[k_slot],
        score_types=types,
        scores=scores,
        score_ts=ts,
        score_event_ids=[batch.event_ids[i] or batch.entry_ids[i] for i in idx.tolist()],
        arrival_ms=np.fromiter((batch.entry_keys[i][0] for i in idx), np.float64, len(idx)),
        dead=batch.dead,
        outcomes=outcomes,
        unknown_types=int((type_idx == model.unknown_index).sum()),
    )
