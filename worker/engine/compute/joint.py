"""A group's batches built as one: a node's batches at low traffic (each an event or two of
its own partition) go through the pipeline's stages once, then the Commit is shared out.

Each stage's fixed cost (its kernel calls, its numpy calls) was paid once a batch: at low
traffic a round brings a few one-event batches, and building them one by one cost several
times building them together. The users of distinct partitions are distinct and every stage
works user by user, so each batch's share of the group's Commit is what `build_commit` gives
it alone: its state rows, its score entries, its actions (the conformance test compares
them). The counts that are the group's sums (resends forgotten early, live quality's
samples, the inputs' counts, the shadow's firings) ride on the first batch's commit alone:
the group commits all or nothing (adapters/together.py), so each is counted once.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import numpy as np

from model.input_bytes import RawInputs
from model.scoring import ScoringModel
from worker.common.dedup import ResendWindow
from worker.engine.compute.batch import Batch, seconds_of
from worker.engine.compute.deferred import Deferred
from worker.engine.compute.parts.part import Share
from worker.engine.compute.pipeline import Commit, build_commit, commit_of, run_stages
from worker.engine.compute.user_states import ShadowStates, UserStates
from worker.rules.step import RuleTable


@dataclass(frozen=True)
class Group:
    """A group's Commit, each batch's Commit (its share) and where its share sits in it."""

    whole: Commit
    commits: list[Commit]
    ranges: list[Share]


def build_commits(
    batches: list[Batch], states: list[UserStates], model: ScoringModel, history_events: int,
    shadow: ScoringModel | None, resends: ResendWindow, rules: RuleTable | None,
) -> list[Commit]:  # fmt: skip
    """Each batch's Commit (of distinct partitions, `states` each one's users'), computed
    together when they can be joined, else one by one; the group's sums on the first."""
    group = build_group(batches, states, model, history_events, shadow, resends, rules)
    if group is None:
        return [build_commit(b, s, model, history_events, shadow, resends, rules)
                for b, s in zip(batches, states, strict=True)]  # fmt: skip
    return group.commits


def build_group(
    batches: list[Batch], states: list[UserStates], model: ScoringModel, history_events: int,
    shadow: ScoringModel | None, resends: ResendWindow, rules: RuleTable | None,
    together: UserStates | None = None,
) -> Group | None:  # fmt: skip
    """The batches built as one and the Commit shared out (`build_commits`); None when they
    cannot be joined (a user in two, inputs of other names, a shadow's states beside some).
    `together`: the states as one, when read so (`states` its views: StateReader.complete_all),
    not joined again here."""
    joined = _joined(batches, states, together)
    if joined is None:
        return None
    batch, together = joined
    run, runs, parts = run_stages(batch, together, model, history_events, shadow, resends, rules)
    whole = commit_of(run, runs[0], parts)
    # each batch's state rows and score entries: ranges of the group's, in the batches' order
    # (bisected in the runs' plain lists: a round's few rows cost less than numpy's calls)
    row_ends = accumulate(len(s.users) for s in states)
    score_ends = accumulate(len(b.users) for b in batches)
    rows = [0, *(bisect_left(run.touched_list, end) for end in row_ends)]
    scores = [0, *(bisect_left(run.picked, end) for end in score_ends)]
    unknown = [0, *accumulate((runs[0].type_idx == model.unknown_index).tolist())]
    local = _Local(whole, rows, scores)
    commits, ranges = [], []
    for i, (b, s) in enumerate(zip(batches, states, strict=True)):
        share = Share(b, slice(rows[i], rows[i + 1]), slice(scores[i], scores[i + 1]), i == 0)
        commits.append(_shared(whole, share, s.seq, unknown[scores[i + 1]] - unknown[scores[i]],
                               local))  # fmt: skip
        ranges.append(share)
    return Group(whole, commits, ranges)


class SharedCommit(Deferred, Commit):
    """A batch's share of a group's Commit (`_shared`): made with what its transaction is
    packed and judged from (partition, sequence, entries, users, scores, parts), the rest
    sliced from the group's on first use, by the settling, once the transaction is sent."""


class _Local:
    """The group's last_scored and score_user with each row's and entry's counted in its
    own batch, for every share at once, made when the first share is filled (a
    subtraction a batch cost two numpy calls each)."""

    def __init__(self, whole: Commit, rows: list[int], scores: list[int]) -> None:
        self.whole, self.rows, self.scores = whole, rows, scores
        self._made: tuple[np.ndarray, np.ndarray] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(last_scored, score_user) renumbered in each batch."""
        if self._made is None:
            rows, scores, spans = self.rows, self.scores, range(len(self.rows) - 1)
            first_entry = [scores[i] for i in spans for _ in range(rows[i], rows[i + 1])]
            first_row = [rows[i] for i in spans for _ in range(scores[i], scores[i + 1])]
            self._made = (self.whole.last_scored - np.array(first_entry, np.int64),
                          self.whole.score_user - np.array(first_row, np.int64))  # fmt: skip
        return self._made


def _shared(whole: Commit, s: Share, seq: bytes, unknown_types: int, local: _Local) -> Commit:
    """One batch's Commit from the group's: its rows and score entries, renumbered; what
    packing and judging its transaction reads made now, the rest when read."""
    b, rows = s.batch, s.rows
    parts = [part.share(s) for part in whole.parts]
    head = {
        "partition": b.partition,
        "model": whole.model,
        "seq": seq,
        "ack_ids": b.ids,
        "users": whole.users[rows],
        "scores": whole.scores[s.scores],
        "parts": parts,
        "_kinds": {type(x): x for x in parts},
        "rewrite": [r - rows.start for r in whole.rewrite if rows.start <= r < rows.stop],
        "after": b.after,
    }
    return SharedCommit.made(head, partial(_rest, whole, s, unknown_types, local))


def _rest(whole: Commit, s: Share, unknown_types: int, local: _Local) -> dict:
    """The fields of a share that `_shared` defers."""
    b, rows, scores = s.batch, s.rows, s.scores
    scored = scores.stop - scores.start
    last_scored, score_user = local.arrays()
    return {
        "h": whole.h[rows],
        "user_scores": whole.user_scores[rows],
        "last_scored": last_scored[rows],
        "last_ids": whole.last_ids[rows],
        "last_keys": whole.last_keys[rows],
        "last_ts": whole.last_ts[rows],
        "n": whole.n[rows],
        "event_ids": whole.event_ids[rows],
        "recent": whole.recent[rows],
        "score_user": score_user[scores],
        "score_types": whole.score_types[scores],
        "score_ts": whole.score_ts[scores],
        "score_event_ids": whole.score_event_ids[scores],
        "arrival_ms": whole.arrival_ms[scores],
        "outcomes": {
            "scored": scored,
            "duplicate": len(b.users) - scored,
            "deadletter": len(b.dead) - b.misrouted,
            "misrouted": b.misrouted,
            "lost": b.lost,
        },
        "unknown_types": unknown_types,
        "resend_overflow": whole.resend_overflow if s.first else 0,
    }


def _joined(
    batches: list[Batch], states: list[UserStates], together: UserStates | None = None
) -> tuple[Batch, UserStates] | None:  # fmt: skip
    """The batches' valid events as one batch and their users' states as one (`together`
    when given), in order; None when they cannot be joined (a user in two, inputs of other
    names, a shadow's states beside some only)."""
    users = together.users if together is not None else [u for s in states for u in s.users]
    if len(batches) < 2 or len(set(users)) != len(users):
        return None
    inputs = _joined_inputs([b.inputs for b in batches])
    if inputs is False:
        return None
    shadows = [s.shadow for s in states if s.shadow is not None]
    # states completed as one are whole, with a shadow's beside all or none, by construction
    if together is None and (not all(map(_whole, states)) or 0 < len(shadows) < len(states)):
        return None
    batch = Batch(
        batches[0].partition,
        ids=[i for b in batches for i in b.ids],
        users=[u for b in batches for u in b.users],
        types=[t for b in batches for t in b.types],
        ts=[t for b in batches for t in b.ts],
        entry_ids=[i for b in batches for i in b.entry_ids],
        entry_keys=[k for b in batches for k in b.entry_keys],
        entry_seconds=_joined_seconds(batches),
        event_ids=[i for b in batches for i in b.event_ids],
        producers=[p for b in batches for p in b.producers],
        inputs=inputs,
    )
    if together is not None:
        return batch, together
    starts = list(accumulate((len(s.users) for s in states), initial=0))
    together = UserStates(
        users=users,
        h=np.concatenate([s.h for s in states]),
        last_ts=np.concatenate([s.last_ts for s in states]),
        last_id=[x for s in states for x in s.last_id],
        n=np.concatenate([s.n for s in states]),
        event_ids=[x for s in states for x in s.event_ids],
        seq=b"",
        score=np.concatenate([s.score for s in states]),
        recent=[x for s in states for x in s.recent],
        rules=[x for s in states for x in s.rules],
        items=[x for s in states for x in s.items],
        replay=_moved([s.replay for s in states], starts),
        rewrite=_moved([s.rewrite for s in states], starts),
        shadow=_joined_shadows(shadows, starts) if shadows else None,
    )
    return batch, together


def _whole(s: UserStates) -> bool:
    """Whether every per-user field of the states has a row per user (as read)."""
    return (len(s.users) == len(s.h) == len(s.last_ts) == len(s.last_id) == len(s.n)
            == len(s.event_ids) == len(s.score) == len(s.recent) == len(s.rules)
            == len(s.items))  # fmt: skip


def _joined_seconds(batches: list[Batch]) -> np.ndarray | None:
    """The batches' events' entry times in seconds, as the resends stage reads them; None
    when none has them yet (a few events each: the stage works them out once, for all)."""
    if all(b.entry_seconds is None for b in batches):
        return None
    return np.concatenate([b.entry_seconds if b.entry_seconds is not None
                           else seconds_of(b.entry_keys) for b in batches])  # fmt: skip


def _moved(rows: list[list[int]], starts: list[int]) -> list[int]:
    """Each states' row numbers moved to their place in the joined states."""
    return [r + start for part, start in zip(rows, starts, strict=False) for r in part]


def _joined_shadows(shadows: list[ShadowStates], starts: list[int]) -> ShadowStates:
    """The shadow model's states of every batch as one (a batch's missing scores and rule
    states as shadow_run reads them: none yet)."""
    scores = [s.score if s.score is not None else np.full(len(s.last_ts), np.nan) for s in shadows]
    return ShadowStates(
        h=np.concatenate([s.h for s in shadows]),
        last_ts=np.concatenate([s.last_ts for s in shadows]),
        replay=_moved([s.replay for s in shadows], starts),
        score=np.concatenate(scores),
        rules=[x for s in shadows for x in (s.rules or [b""] * len(s.last_ts))],
    )


def _joined_inputs(inputs: list[RawInputs | None]) -> RawInputs | bool | None:
    """The batches' raw input values as one (their offsets moved into the joined data);
    None when none has any, False when they cannot be joined (some without, other names)."""
    present = [x for x in inputs if x is not None]
    if not present:
        return None
    if len(present) < len(inputs) or len({x.names for x in present}) != 1:
        return False
    offsets = np.cumsum([0, *(len(x.data) for x in present)]).tolist()
    return RawInputs(
        present[0].names,
        b"".join(x.data for x in present),
        np.hstack([x.starts + at for x, at in zip(present, offsets, strict=False)]),
        np.hstack([x.ends + at for x, at in zip(present, offsets, strict=False)]),
    )
