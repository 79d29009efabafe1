"""The rule step: which events fire which intent rules, and each user's rule state after them
(docs/contract.md, Acting on intent).

A rule is armed when a user's session starts. It fires at an event when it is armed, the score
after the event is >= `above`, the event's type is listed (no list: any type), the session
holds at least `min_events` events counting this one, and its cooldown since it last fired for
that user has passed (in event time). Firing disarms it; the first later event scoring below
`rearm_below` re-arms it, also during a cooldown (which still holds back the next firing).

A user's rule state is committed with the score in one atomic step, so it is plain data: the
session's event count and, per rule that is not in its initial state (armed, never fired), a
flag and the time it last fired. Layout of the state field `rules` (ASCII):

    <n> <session events> [<rule>:<armed 0|1>:<last fired ms> ...]

`n` is the user's count of applied events when it was written (the state's `n`): while no
rule is set, commits leave the field alone, so a field whose `n` is not the state's own is
stale and reads as none (the session's count then comes from `recent`, as for a user who
never had one).

Rules absent from the field are armed and never fired: a new rule starts fresh for every
user, and a deleted rule's entries fall away at the user's next commit.

`step` is the batched kernel; `reference_step` is the same definition in plain Python, the
oracle of the property-based test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numba as nb
import numpy as np

NEVER = -1  # last fired: never


class RuleLike(Protocol):
    """What the rule step reads of a rule (worker/rules/definition.py: Rule)."""

    name: str
    above: float
    cooldown_ms: int
    min_events: int
    types: tuple[str, ...]

    @property
    def rearm(self) -> float: ...


@dataclass(frozen=True)
class RuleTable:
    """A rule set as the kernel reads it: one column per rule, in name order."""

    version: int
    names: tuple[str, ...]
    above: np.ndarray  # (R,) float64
    rearm: np.ndarray  # (R,) float64
    cooldown_ms: np.ndarray  # (R,) int64
    min_events: np.ndarray  # (R,) int64
    types: tuple[frozenset[str] | None, ...]  # None: any type
    # type_mask per model vocabulary: a table meets one or two models, every batch
    _masks: dict[tuple[str, ...], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    columns: dict[str, int] = field(init=False, repr=False, compare=False)  # by rule name

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", {name: r for r, name in enumerate(self.names)})

    @classmethod
    def of(cls, rules: Sequence[RuleLike], version: int = 0) -> RuleTable:
        """The table of a rule set."""
        rules = sorted(rules, key=lambda r: r.name)
        return cls(
            version=version,
            names=tuple(r.name for r in rules),
            above=np.asarray([r.above for r in rules], np.float64),
            rearm=np.asarray([r.rearm for r in rules], np.float64),
            cooldown_ms=np.asarray([r.cooldown_ms for r in rules], np.int64),
            min_events=np.asarray([r.min_events for r in rules], np.int64),
            types=tuple(frozenset(r.types) if r.types else None for r in rules),
        )

    def __len__(self) -> int:
        return len(self.names)

    def type_mask(self, event_types: Sequence[str]) -> np.ndarray:
        """(V + 1, R) bool, read-only: whether rule r takes an event of model type index v
        (the last row is the model's unknown type, which no listed type matches: see
        `allowed`). Made once per vocabulary."""
        key = tuple(event_types)
        mask = self._masks.get(key)
        if mask is None:
            mask = np.ones((len(key) + 1, len(self)), np.bool_)
            for r, listed in enumerate(self.types):
                if listed is not None:
                    mask[:, r] = [t in listed for t in key] + [False]
            mask.flags.writeable = False
            self._masks[key] = mask
        return mask

    def allowed(self, mask: np.ndarray, type_idx: np.ndarray, types: Sequence[str]) -> np.ndarray:
        """(E, R) bool: whether each event's type is taken by each rule. `mask` is
        `type_mask` of the model that indexed the types; events of a type the model does not
        know are checked by name (rare: unknown types are counted as a data problem)."""
        allowed = mask[type_idx]
        unknown = np.flatnonzero(type_idx == mask.shape[0] - 1)
        for e in unknown.tolist():
            allowed[e] = [listed is None or types[e] in listed for listed in self.types]
        return allowed


@dataclass
class RuleStates:
    """The rule states of a batch's users, advanced in place by `step`."""

    session_n: np.ndarray  # (U,) int64 events of the current session so far
    armed: np.ndarray  # (U, R) bool
    last_fired: np.ndarray  # (U, R) int64 epoch ms, NEVER = -1

    @classmethod
    def fresh(cls, n_users: int, n_rules: int) -> RuleStates:
        """Every rule armed and never fired, no session events."""
        return cls(
            np.zeros(n_users, np.int64),
            np.ones((n_users, n_rules), np.bool_),
            np.full((n_users, n_rules), NEVER, np.int64),
        )


def parse_rule_state(
    raw: bytes, names: Sequence[str], states: RuleStates, row: int, n: int,
    columns: dict[str, int] | None = None,
) -> bool:  # fmt: skip
    """Load one user's `rules` field into row `row` of `states` (rules of `names`, whose
    `columns` by name may be given), given the user's applied-event count `n`; returns
    False, leaving the row fresh, when the field is malformed or stale (written at another
    count)."""
    written_at, _, rest = raw.partition(b" ")
    if rest.isdigit():  # the common case: every rule armed and never fired
        if not written_at.isdigit() or int(written_at) != n:
            return False
        states.session_n[row] = int(rest)
        return True
    parts = raw.split(b" ")
    try:
        if len(parts) < 2 or not parts[0].isdigit() or int(parts[0]) != n:
            return False
        session_n = int(parts[1])
        entries = []
        for part in parts[2:]:
            name, armed, last = part.split(b":")
            if armed not in (b"0", b"1"):
                return False
            entries.append((name.decode("ascii"), armed == b"1", int(last)))
    except (ValueError, UnicodeDecodeError):
        return False
    if session_n < 0:
        return False
    states.session_n[row] = session_n
    column = {name: r for r, name in enumerate(names)} if columns is None else columns
    for name, armed, last in entries:
        r = column.get(name)
        if r is not None:
            states.armed[row, r] = armed
            states.last_fired[row, r] = last
    return True


def pack_rule_states(
    names: Sequence[str], states: RuleStates, rows: np.ndarray, n: np.ndarray
) -> list[bytes]:
    """The `rules` field of each of `rows`, whose users' applied-event counts are now `n`:
    users whose rules are all in their initial state (the common case) cost one format."""
    packed = list(map(b"%d %d".__mod__, zip(n.tolist(), states.session_n[rows].tolist(),
                                             strict=True)))  # fmt: skip
    moved = ~states.armed[rows] | (states.last_fired[rows] != NEVER)
    movers = np.flatnonzero(moved.any(axis=1))
    if not len(movers):
        return packed
    encoded = [name.encode() for name in names]
    # plain lists: indexing numpy arrays element by element costs ~100 ns a value
    at = rows[movers]
    for k, armed, last, which in zip(movers.tolist(), states.armed[at].tolist(),
                                     states.last_fired[at].tolist(), moved[movers].tolist(),
                                     strict=True):  # fmt: skip
        packed[k] += b"".join([b" %s:%d:%d" % (encoded[r], armed[r], last[r])
                               for r, m in enumerate(which) if m])  # fmt: skip
    return packed


@nb.njit(cache=True)
def _step(slot, scores, ts, last_ts, session_gap_seconds, allowed, above, rearm, cooldown,
          min_events, session_n, armed, last_fired, fired, session_start):  # fmt: skip
    n_events, n_rules = allowed.shape
    count = 0
    for e in range(n_events):
        s = slot[e]
        t = ts[e]
        prev = last_ts[s]
        # a session starts as the model's does (model/features.py: event_gaps, session_resets)
        new = prev < 0
        if prev >= 0 and session_gap_seconds > 0 and t > prev:
            new = (t - prev) / 1000.0 > session_gap_seconds
        if t > prev:
            last_ts[s] = t
        session_start[e] = new
        if new:
            session_n[s] = 0
            for r in range(n_rules):
                armed[s, r] = True
        session_n[s] += 1
        score = scores[e]
        for r in range(n_rules):
            if not armed[s, r]:
                if score < rearm[r]:
                    armed[s, r] = True
                continue
            if (
                score >= above[r]
                and allowed[e, r]
                and session_n[s] >= min_events[r]
                and (last_fired[s, r] == -1 or t - last_fired[s, r] >= cooldown[r])
            ):
                armed[s, r] = False
                last_fired[s, r] = t
                fired[count, 0] = e
                fired[count, 1] = r
                count += 1
    return count


@dataclass(frozen=True)
class Firings:
    """The rule firings of a batch, in event order: event index and rule index of each, and
    whether each event started a session."""

    event: np.ndarray  # (F,) int64 index into the events stepped
    rule: np.ndarray  # (F,) int64 index into the table's rules
    session_start: np.ndarray  # (E,) bool


def step(
    table: RuleTable, states: RuleStates, last_ts: np.ndarray, session_gap_seconds: float,
    slot: np.ndarray, scores: np.ndarray, ts: np.ndarray, allowed: np.ndarray,
) -> Firings:  # fmt: skip
    """Step every rule over a batch's events in order (event e of user row slot[e], its score
    after the event, its time, `allowed` from RuleTable.allowed); `states` advance in place.
    `last_ts` holds each user's last event time before the batch and is not modified."""
    fired = np.empty((len(slot) * len(table), 2), np.int64)
    session_start = np.empty(len(slot), np.bool_)
    count = _step(
        slot.astype(np.int64, copy=False), scores.astype(np.float64), ts.astype(np.int64),
        last_ts.astype(np.int64, copy=True), float(session_gap_seconds),
        np.ascontiguousarray(allowed), table.above, table.rearm, table.cooldown_ms,
        table.min_events, states.session_n, states.armed, states.last_fired, fired,
        session_start,
    )  # fmt: skip
    return Firings(fired[:count, 0].copy(), fired[:count, 1].copy(), session_start)


def reference_step(
    rules: Sequence[RuleLike], state: dict, last_ts: int, session_gap_seconds: float,
    score: float, type_: str, ts: int,
) -> tuple[list[str], dict, int]:  # fmt: skip
    """One event for one user, in plain Python: (names of the rules fired, the new state, the
    new last time). `state` is {"session_n": int, rule name: (armed, last fired)}."""
    state = dict(state)
    new = last_ts < 0 or (
        session_gap_seconds > 0 and ts > last_ts and (ts - last_ts) / 1000.0 > session_gap_seconds
    )
    if new:  # every rule re-arms; cooldowns run on
        fired_at = {k: v[1] for k, v in state.items() if k != "session_n"}
        state = {"session_n": 0} | {name: (True, last) for name, last in fired_at.items()}
    state["session_n"] = state.get("session_n", 0) + 1
    fired = []
    for rule in rules:
        armed, last = state.get(rule.name, (True, NEVER))
        if not armed:
            armed = score < rule.rearm
        elif (
            score >= rule.above
            and (not rule.types or type_ in rule.types)
            and state["session_n"] >= rule.min_events
            and (last == NEVER or ts - last >= rule.cooldown_ms)
        ):
            armed, last = False, ts
            fired.append(rule.name)
        state[rule.name] = (armed, last)
    return fired, state, max(last_ts, ts)


def warm_up() -> None:
    """Compile (or load from cache) the rule kernel now, not at the first batch of a worker
    with rules."""
    one = np.zeros(1, np.int64)
    table = RuleTable(0, ("warm",), np.full(1, 0.5), np.full(1, 0.5), one, one, (None,))
    step(table, RuleStates.fresh(1, 1), one, 1800.0, one, np.zeros(1, np.float32), one,
         np.ones((1, 1), np.bool_))  # fmt: skip
