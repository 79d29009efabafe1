"""The batch pipeline as a pure function: parsed batch + users' states + models -> a Commit.

No Redis here. A batch flows through named stages: parse (compute/batch.py, before), then
resends, cell, rows and histories (compute/stages.py), which every commit needs, then the
optional stages (`STAGES`), each adding its part to the commit (compute/parts/): dead
letters, actions, the shadow, item memories, live quality, input counts. The current and the
shadow model run the same stages, each from its own states. adapters/commit.py packs and
applies a Commit atomically; adapters/states.py reads the UserStates it starts from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TypeVar

import numpy as np

from model.scoring import ScoringModel
from worker.common.dedup import DEFAULT_RESENDS, ResendWindow
from worker.engine.compute.actions import Action
from worker.engine.compute.batch import Batch, DeadLetter
from worker.engine.compute.parts.actions import Actions, actions_stage
from worker.engine.compute.parts.dead_letters import DeadLetters, dead_letters_stage
from worker.engine.compute.parts.input_counts import InputCounts, input_counts_stage
from worker.engine.compute.parts.item_memories import ItemMemories, item_memories_stage
from worker.engine.compute.parts.part import Part
from worker.engine.compute.parts.quality import Quality, quality_stage
from worker.engine.compute.parts.shadow import Shadow, shadow_run, shadow_stage
from worker.engine.compute.stages import (
    ModelRun,
    Run,
    cell_stage,
    histories_stage,
    model_run,
    resends_stage,
    rows_stage,
)
from worker.engine.compute.user_states import UserStates
from worker.rules.step import RuleTable

P = TypeVar("P", bound=Part)

OUTCOMES = ("scored", "duplicate", "deadletter", "misrouted", "lost")

# The optional stages, in order: each gives its part of the commit (or None). Their parts'
# writes go in this order too (adapters/commit.py). A new sink: its module in parts/ and
# its stage here.
STAGES: tuple[Callable[[Run, list[ModelRun]], Part | None], ...] = (
    dead_letters_stage,
    actions_stage,
    shadow_stage,
    item_memories_stage,
    quality_stage,
    input_counts_stage,
)


@dataclass
class Commit:
    """Everything one partition batch writes, all or nothing (adapters/commit.py): the core
    every batch writes, and the parts its features added."""

    partition: int
    model: str  # version that computed the states and scores
    seq: bytes  # the commit sequence the states were read at
    ack_ids: list[bytes]  # every entry of the batch, in stream order (the last: the new position)
    # one row per user state written (users with at least one scored event)
    users: list[str]
    h: np.ndarray  # (K, L, H) float32
    user_scores: np.ndarray  # (K,) float32: the score of the user's last event
    last_scored: np.ndarray  # (K,) int64: that event's index in the score rows below
    last_ids: list[bytes]  # entry id of the user's last applied event
    last_keys: list[tuple[int, int]]  # the same as (ms, seq)
    last_ts: np.ndarray  # (K,) int64
    n: np.ndarray  # (K,) int64
    event_ids: list[bytes]  # the user's last applied producer event ids, space-separated
    recent: list[bytes]  # the user's recent session events, packed (compute/recent.py)
    # one row per score entry, in stream order
    score_user: np.ndarray  # (S,) int64 index into the state rows above
    score_types: list[str]
    scores: np.ndarray  # (S,) float32
    score_ts: np.ndarray  # (S,) int64
    score_event_ids: list[bytes]  # the producer's event id, else the entry id
    arrival_ms: np.ndarray  # (S,) float64 entry id time of each scored event
    outcomes: dict[str, int]  # entries per outcome; they sum to len(ack_ids)
    unknown_types: int  # scored events of types the model does not know
    resend_overflow: int  # own event ids forgotten by the memory's bound before their time
    parts: list[Part] = field(default_factory=list)  # in `STAGES` order
    rewrite: list[int] = field(default_factory=list)  # state rows to rewrite whole (UserStates)
    after: bytes = b"0-0"  # the entry the batch follows: the partition's last commit, or refused
    _kinds: dict[type, Part] = field(init=False, repr=False)  # the parts by their class

    def __post_init__(self) -> None:
        self._kinds = {type(x): x for x in self.parts}

    def part(self, kind: type[P]) -> P | None:
        """Its part of this kind, if a stage added one."""
        found = self._kinds.get(kind)
        return found if isinstance(found, kind) else None

    # Read views of the parts, for the readers that name a feature (the replay, the cache,
    # the lean layout, tests); the committer and the tally go through the parts' hooks.

    @property
    def dead(self) -> list[DeadLetter]:
        part = self.part(DeadLetters)
        return part.letters if part is not None else []

    @property
    def actions(self) -> list[Action]:
        part = self.part(Actions)
        return part.actions if part is not None else []

    @property
    def rules(self) -> list[bytes] | None:
        """Each state row's rule states (None: no rules set)."""
        part = self.part(Actions)
        return part.rules if part is not None else None

    @property
    def items(self) -> list[bytes] | None:
        part = self.part(ItemMemories)
        return part.items if part is not None else None

    @property
    def write_items(self) -> bool:
        part = self.part(ItemMemories)
        return part is not None and part.write

    @property
    def shadow(self) -> Shadow | None:
        return self.part(Shadow)

    @property
    def shadow_model(self) -> str:
        return self.shadow.model if self.shadow is not None else ""

    @property
    def shadow_h(self) -> np.ndarray | None:
        return self.shadow.h if self.shadow is not None else None

    @property
    def shadow_scores(self) -> np.ndarray | None:
        return self.shadow.scores if self.shadow is not None else None

    @property
    def shadow_user_scores(self) -> np.ndarray | None:
        return self.shadow.user_scores if self.shadow is not None else None

    @property
    def shadow_rules(self) -> list[bytes] | None:
        return self.shadow.rules if self.shadow is not None else None

    @property
    def shadow_actions(self) -> Counter[str]:
        return self.shadow.fired if self.shadow is not None else Counter()

    @property
    def quality(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        part = self.part(Quality)
        return part.samples if part is not None else {}

    @property
    def input_counts(self) -> dict[str, tuple[int, int]]:
        part = self.part(InputCounts)
        return part.counts if part is not None else {}


def _rewritten(rows: list[int], touched: list[int], row_of_slot: np.ndarray) -> list[int]:
    """The commit rows of the state rows to rewrite whole that the commit writes."""
    if not rows:
        return []
    written = set(touched)
    return [int(row_of_slot[s]) for s in rows if s in written]


def build_commit(
    batch: Batch,
    states: UserStates,
    model: ScoringModel,
    history_events: int = 0,
    shadow: ScoringModel | None = None,
    resends: ResendWindow = DEFAULT_RESENDS,
    rules: RuleTable | None = None,
) -> Commit:
    """Decide every entry's outcome, advance the states, and return what to commit.

    `states` must hold the batch's distinct users (see `distinct_users`); their h and
    last_ts are advanced in place. Rows in `states.replay` are rebuilt first from their
    recent events (no score entries for those steps). Each written state keeps its last
    `history_events` events of the current session (0 = none), and remembers the producer
    event ids of the `resends` window. A shadow model (with `states.shadow`) scores the
    same events from its own states. With `rules` (not empty), the rules step over the
    scores and the Commit carries the actions they fire and the users' rule states.
    """
    run, runs, parts = run_stages(batch, states, model, history_events, shadow, resends, rules)
    return commit_of(run, runs[0], parts)


def run_stages(
    batch: Batch, states: UserStates, model: ScoringModel, history_events: int,
    shadow: ScoringModel | None, resends: ResendWindow, rules: RuleTable | None,
) -> tuple[Run, list[ModelRun], list[Part]]:  # fmt: skip
    """`build_commit`'s stages: the Run, the models' runs (the current first) and the parts."""
    run = Run(batch, states, history_events, rules)
    runs = [model_run("current", model, states)]
    if shadow is not None and states.shadow is not None:
        runs.append(shadow_run(shadow, states))
    resends_stage(run, resends, [m.model for m in runs])
    for m in runs:
        cell_stage(run, m)
    rows_stage(run)
    parts = [part for stage in STAGES if (part := stage(run, runs)) is not None]
    return run, runs, parts


def commit_of(run: Run, current: ModelRun, parts: list[Part]) -> Commit:
    """The Commit: what every batch writes, from the core stages, and the parts."""
    batch, states, touched, picked = run.batch, run.states, run.touched, run.picked
    last = run.last_event[touched]
    last_of_user = run.idx[last].tolist()
    if len(run.touched_list) == len(states.users):  # the common case: every user is written
        written_users = list(states.users)
    else:
        written_users = [states.users[s] for s in run.touched_list]
    arrival_ms = np.fromiter(map(itemgetter(0), run.taken(batch.entry_keys)), np.float64,
                             len(picked))  # fmt: skip
    return Commit(
        partition=batch.partition,
        model=current.model.version,
        seq=states.seq,
        ack_ids=batch.ids,
        users=written_users,
        h=states.h[touched],
        user_scores=current.scores[last],
        last_scored=last,
        last_ids=[batch.entry_ids[i] for i in last_of_user],
        last_keys=[batch.entry_keys[i] for i in last_of_user],
        last_ts=states.last_ts[touched],
        n=run.n_after(),
        event_ids=[run.remembered.get(s, states.event_ids[s]) for s in run.touched_list],
        recent=histories_stage(run, current.model),
        score_user=run.row_of_slot[run.k_slot],
        score_types=run.types,
        scores=current.scores,
        score_ts=run.ts,
        score_event_ids=run.score_event_ids,
        arrival_ms=arrival_ms,
        outcomes={
            "scored": len(run.idx),
            "duplicate": len(batch.users) - len(run.idx),
            "deadletter": len(batch.dead) - batch.misrouted,
            "misrouted": batch.misrouted,
            "lost": batch.lost,
        },
        unknown_types=int((current.type_idx == current.model.unknown_index).sum()),
        resend_overflow=run.overflow,
        parts=parts,
        rewrite=_rewritten(states.rewrite, run.touched_list, run.row_of_slot),
        after=batch.after,
    )
