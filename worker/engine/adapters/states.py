"""Reading users' states: from the write-through cache, else one pipelined read (the
partition's sequence, then an HMGET per state), validated into the pipeline's UserStates
(docs/contract.md, User state and scores out).

A hidden state belongs to the model that computed it: it is read only by a model of the same
state space (its meta's `state_space`, else its version). Any other state is rebuilt by the
pipeline from the user's recent events (`recent`), or restarts from zero without them.

Any data may sit where a state should: a wrong size, non-finite values, an unparseable field,
or a key of another type (an operator's SET). Each is an invalid state: that user restarts
from zero (rebuilt from `recent` where it can be), counted by reason, and nothing else is
affected. Only a partition-wide key in a bad way (the commit sequence) stops that
partition's reads (PartitionDataError), never the other partitions.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Collection
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import redis

from worker.common.connection import is_cluster, packed_replies, refresh_topology
from worker.common.dedup import bounded
from worker.common.entry_ids import entry_id
from worker.common.keys import Keys
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.adapters.resp import packed, resp_commands
from worker.engine.compute.histories import valid_histories
from worker.engine.compute.lean_state import later_id, unpack_state
from worker.engine.compute.state_cache import CachedState, StateCache, copy_known
from worker.engine.compute.user_states import ShadowStates, UserStates

FIELDS = ("h", "last_id", "last_ts", "model", "n", "event_ids", "recent", "shadow_h",
          "shadow_model", "score", "shadow_score", "rules", "shadow_rules", "items",
          "s")  # fmt: skip

# A rule-state field longer than this was not written by a worker (64 rules of ~90 bytes):
# read as none, so crafted data costs no parsing time.
MAX_RULES_BYTES = 8192

# One read: GET of the partition's commit sequence, then an HMGET of FIELDS per state key, in
# one pipeline. The sequence is read first: a commit that lands between the two makes some
# states newer than it, and the commit built on them is refused (`conflict`), never applied.
# Why not a Lua script reading them all: it cost Redis about 5 µs a state against 2 for the
# HMGET (BENCHMARKS.md, The commit's Redis CPU).
WRONG_TYPE = -1  # h of a state key that holds another type, the other fields None


# Up to this many state keys a round, its reads' HMGETs are laid out at once (StateReader.commands)
FEW_READS = 32


@dataclass(frozen=True)
class StateRead:
    """The read of a request's misses as RESP, and the number of its replies."""

    packed: bytes
    replies: int


def _bounded_field(raw: bytes | None) -> bytes:
    """A stored rule-state or item-memory field, b"" when absent or too long to be a
    worker's (rules/step.py and compute/items.py parse and validate the rest)."""
    return raw if raw and len(raw) <= MAX_RULES_BYTES else b""


def _number(raw: bytes | None) -> float:
    """A stored score, NaN when absent or not a number."""
    try:
        return float(raw) if raw is not None else float("nan")
    except ValueError:
        return float("nan")


class PartitionDataError(Exception):
    """A partition-wide key holds data the worker cannot use; the message names it."""

    def __init__(self, partition: int, detail: str) -> None:
        super().__init__(f"partition {partition}: {detail}")
        self.partition = partition


@dataclass(frozen=True)
class StateRequest:
    """A batch's users of one partition: the states known without a read (cache or a
    commit in flight), the rows to read, and the sequence the known ones hold at."""

    partition: int
    users: list[str]
    known: list[CachedState | None]
    misses: list[int]
    seq: bytes | None  # None: nothing known, the read's sequence decides
    pending: list[int]  # rows whose states a commit in flight writes


SpaceOf = Callable[[str], str]  # model version -> its state space


class StateReader:
    """Reads a batch's user states for one worker process."""

    def __init__(
        self, client: redis.Redis, keys: Keys, cache: StateCache, space_of: SpaceOf,
        layout: str = "full", nodes: PartitionNodes | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.nodes = nodes  # on a cluster, who holds each partition
        self.keys = keys
        self.cache = cache
        self.space_of = space_of  # the state space of the model version that wrote a state
        self.lean = layout == "lean"  # the layout the commits write
        self._get_seq: dict[int, bytes] = {}  # each partition's GET of its sequence, packed

    def read(
        self,
        p: int,
        users: list[str],
        shape: tuple[int, int],
        space: str,
        shadow: tuple[tuple[int, int], str] | None = None,
    ) -> UserStates:
        """The states of `users` of partition p for a model of state shape `shape` and state
        space `space`, and for a shadow model of (shape, space) when one runs."""
        while True:
            request = self.request(p, users)
            read = self.command(request)
            flat = self._run(p, read) if read is not None else None
            states = self.complete(request, flat, shape, space, shadow)
            if states is not None:
                return states
            # another commit landed since ours: nothing cached for this partition holds
            self.cache.drop(p)

    def request(
        self, p: int, users: list[str], in_flight: Collection[str] = (),
        in_flight_seq: bytes | None = None,
    ) -> StateRequest:  # fmt: skip
        """Which of `users` are known without a read: the cache's, and `in_flight`, the
        users of a commit sent before the read (their states are the ones it writes, given
        to `complete`). With `in_flight_seq`, that commit's read sequence, the read must
        find the partition at it, and cached states count only if they hold at it."""
        seq = self.cache.seq(p)
        if in_flight_seq is not None and seq != in_flight_seq:
            seq = None  # the cache is of another sequence
        cached = self.cache.lookup(p, users) if seq is not None else [None] * len(users)
        pending = [i for i, u in enumerate(users) if u in in_flight] if in_flight else []
        if in_flight_seq is not None:
            seq = in_flight_seq
        taken = set(pending)
        misses = [i for i, c in enumerate(cached) if c is None and i not in taken]
        return StateRequest(p, users, cached, misses, seq, pending)

    def command(self, request: StateRequest) -> StateRead | None:
        """The read of a request's misses: the sequence's GET, then an HMGET per state key
        (None when all are known)."""
        if not request.misses and request.seq is not None:
            return None
        p, users = request.partition, request.users
        keys = list(map(self.keys.state_prefix(p).__add__, (users[i] for i in request.misses)))
        hmgets = b"".join(hmgets_of(keys)) if len(keys) <= FEW_READS else resp_commands(
            ["HMGET", keys, *FIELDS])  # fmt: skip
        return StateRead(self._seq_read(p) + hmgets, len(keys) + 1)

    def _seq_read(self, p: int) -> bytes:
        """The GET of partition p's sequence, packed once (every state read starts with it)."""
        found = self._get_seq.get(p)
        if found is None:
            found = self._get_seq[p] = packed("GET", self.keys.commit_seq(p))
        return found

    def commands(self, requests: list[StateRequest]) -> list[StateRead | None]:
        """Each request's read, as `command` gives it: a few requests' HMGETs (at low traffic,
        a node's round) laid out at once, not a template's fixed cost a request."""
        needed = [r for r in requests if r.misses or r.seq is None]
        if sum(len(r.misses) for r in needed) > FEW_READS:
            return [self.command(r) for r in requests]
        keys = [self.keys.state_prefix(r.partition) + r.users[i] for r in needed for i in r.misses]
        hmgets = iter(hmgets_of(keys))
        out: list[StateRead | None] = []
        for r in requests:
            if not r.misses and r.seq is not None:
                out.append(None)
                continue
            mine = [next(hmgets) for _ in r.misses]
            out.append(StateRead(b"".join([self._seq_read(r.partition), *mine]), len(mine) + 1))
        return out

    def flat(self, p: int, replies: list) -> list:
        """The replies of a read as one list: the sequence (None before the first commit),
        then the FIELDS of each state (None when absent; h = WRONG_TYPE when the key holds
        another type). A redirect (the node does not serve the slot) is raised as it is;
        the sequence of another type, PartitionDataError."""
        seq = replies[0]
        for reply in replies:
            if isinstance(reply, REDIRECTS):
                raise reply
        if isinstance(seq, redis.ResponseError) or (seq is not None and not seq.isdigit()):
            key = self.keys.commit_seq(p)
            raise PartitionDataError(p, f"{key} holds no sequence; fix or delete that key")
        out = [seq]
        for reply in replies[1:]:
            if isinstance(reply, list):
                out += reply
            elif isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply):
                out += [WRONG_TYPE] + [None] * (len(FIELDS) - 1)
            else:
                raise reply  # another refusal (NOPERM, OOM): not the state's fault
        return out

    def _run(self, p: int, read: StateRead) -> list:
        """A read's flat replies, from the one Redis, or the partition's cluster node by the
        slot map (read again when it answers a redirect)."""
        if not is_cluster(self.client):
            return self.flat(p, _replies(self.client, read))
        for attempt in range(3):
            node = self.nodes.node_client(p) if self.nodes is not None else None
            if node is None:
                refresh_topology(self.client)
                node = self.nodes.client(p) if self.nodes is not None else None
            if node is None:
                raise redis.ConnectionError(f"no cluster node known for partition {p}")
            try:
                return self.flat(p, _replies(node, read))
            except redis.exceptions.MovedError:
                if attempt == 2:
                    raise
                refresh_topology(self.client)
        raise AssertionError("unreachable")

    def complete(
        self, request: StateRequest, flat: list | None, shape: tuple[int, int], space: str,
        shadow: tuple[tuple[int, int], str] | None = None,
        in_flight: dict[str, CachedState] | None = None,
    ) -> UserStates | None:  # fmt: skip
        """UserStates from a request, its read's flat replies (`flat`; None when no read was
        needed) and the states the commit in flight writes (for `request.pending`); None
        when the known states no longer hold at the sequence read."""
        states = UserStates.empty(request.users, shape)
        seq = request.seq
        pending = set(request.pending)
        if flat is not None:
            if seq is not None and (flat[0] or b"") != seq:
                return None
            seq = flat[0] or b""
            self._fill(states, request.misses, flat, shape, space, shadow)
        if shadow is not None and states.shadow is None:  # all known: nothing was read
            states.shadow = _fresh_shadow(states, shadow[0])
        rows = [i for i, c in enumerate(request.known) if c is not None and i not in pending]
        known = [request.known[i] for i in rows]
        if request.pending:
            assert in_flight is not None, "pending rows need the states of the commit in flight"
            rows += request.pending
            known += [in_flight[request.users[i]] for i in request.pending]
        if rows:
            copy_known(states, rows, known)
        states.seq = seq
        return states

    def complete_all(
        self, requests: list[StateRequest], flats: list[list | None], shape: tuple[int, int],
        space: str, shadow: tuple[tuple[int, int], str] | None = None,
    ) -> tuple[UserStates, list[UserStates]] | None:  # fmt: skip
        """The states of requests of distinct partitions (a node's round), each read
        (`flats`; None where all were known), as one UserStates and as each request's part of
        it (`complete`'s, as views): one fill for them all, not one each. None when one has
        states pending on a commit in flight or whose known states moved (each is completed
        alone then)."""
        seqs = []  # each request's sequence: its read's, or (all known, no read) its cache's
        for request, flat in zip(requests, flats, strict=True):
            seq = request.seq if flat is None else flat[0] or b""
            if request.pending or seq is None or (request.seq is not None and seq != request.seq):
                return None
            seqs.append(seq)
        starts = list(accumulate((len(r.users) for r in requests), initial=0))
        states = UserStates.empty([u for r in requests for u in r.users], shape)
        misses = [start + i for r, f, start in zip(requests, flats, starts, strict=False)
                  if f is not None for i in r.misses]  # fmt: skip
        read: list = [None]  # the joined replies after a sequence (`_fill` skips it)
        for flat in flats:
            if flat is not None:
                read += flat[1:]
        found = self._fill(states, misses, read, shape, space, shadow)
        if shadow is not None and states.shadow is None:  # all known: nothing was read
            states.shadow = _fresh_shadow(states, shadow[0])
        known = [(start + i, c) for r, start in zip(requests, starts, strict=False)
                 for i, c in enumerate(r.known) if c is not None]  # fmt: skip
        if known:
            copy_known(states, [i for i, _ in known], [c for _, c in known])
        each = [states.view(start, stop, seq)
                for seq, start, stop in zip(seqs, starts, starts[1:], strict=False)]  # fmt: skip
        for row, reason in found:  # each reset counted in its request's (a scan each cost more)
            each[bisect_right(starts, row) - 1].resets[reason] += 1
        return states, each

    def _fill(
        self, states: UserStates, rows: list[int], flat: list, shape, space: str, shadow
    ) -> list[tuple[int, str]]:
        """Validate the read's flat replies (after the sequence) into `states`; the rows
        restarted (or replayed), each with its reason, as counted in `states.resets`."""
        resets: list[tuple[int, str]] = []
        width = len(FIELDS)
        shadow_scores = np.full(len(states.users), np.nan)
        shadow_rules = [b""] * len(states.users)
        mine: list[tuple[int, bytes | None]] = []  # (row, h blob of this model's space)
        theirs: list[tuple[int, bytes | None]] = []  # the same for the shadow model
        histories: list[tuple[int, bytes | None]] = []  # (row, `recent` as read)
        for k, i in enumerate(rows):
            row = flat[1 + width * k : 1 + width * (k + 1)]
            (
                h,
                lid,
                lts,
                by,
                cnt,
                eids,
                recent,
                sh_h,
                sh_by,
                score,
                sh_score,
                rules,
                sh_rules,
                items,
                packed,
            ) = row
            if isinstance(h, int):
                resets.append((i, "wrong_type"))
                continue
            if (lid is not None) if self.lean else (packed is not None):
                states.rewrite.append(i)  # it holds the other layout's fields: they go
            if packed is not None:  # the lean layout's, read out unless the fields are later
                lean = unpack_state(packed)
                if lean is None and lid is None:
                    resets.append((i, "invalid"))  # an `s` that is not one, and no fields
                    continue
                if lean is not None and (lid is None or later_id(lean.last_id, lid)):
                    h, lid, lts, cnt, eids, recent, rules, items = lean
            if lid is None:
                continue  # a new user
            try:
                states.last_id[i] = entry_id(lid)
                states.n[i] = int(cnt or 0)
                states.last_ts[i] = int(lts) if lts is not None else -1
            except ValueError:
                states.last_id[i], states.n[i], states.last_ts[i] = (-1, -1), 0, -1
                resets.append((i, "invalid"))
                continue
            if eids:
                states.event_ids[i] = bounded(eids)
            histories.append((i, recent))
            states.rules[i] = _bounded_field(rules)
            states.items[i] = _bounded_field(items)
            stored = [(h, by), (sh_h, sh_by)]  # a promoted shadow's states are in sh_h
            mine.append((i, self._blob_of(stored, space)))
            states.score[i] = _number(score)
            if shadow is not None:
                theirs.append((i, self._blob_of(stored, shadow[1])))
                shadow_scores[i] = _number(sh_score)
                shadow_rules[i] = _bounded_field(sh_rules)
        for (i, _), recent in zip(histories, valid_histories([r for _, r in histories]),
                                  strict=True):  # fmt: skip
            states.recent[i] = recent
        missing, invalid = self._load(states.h, mine, shape)
        for reason, bad in (("model", missing), ("invalid", invalid)):
            for i in bad:
                resets.append((i, self._rebuild(states, i, reason)))
        if shadow is not None:
            states.shadow = ShadowStates(np.zeros((len(states.users), *shadow[0]), np.float32),
                                         states.last_ts.copy(), score=shadow_scores,
                                         rules=shadow_rules)  # fmt: skip
            missing, invalid = self._load(states.shadow.h, theirs, shadow[0])
            states.shadow.replay = [i for i in missing + invalid if states.recent[i]]
        states.resets.update(reason for _, reason in resets)
        return resets

    def _blob_of(self, stored: list, space: str) -> bytes | None:
        """The stored h (main or shadow field) written by a model of `space`, if any."""
        for blob, by in stored:
            if blob is not None and by and self.space_of(by.decode(errors="replace")) == space:
                return blob
        return None

    @staticmethod
    def _load(
        target: np.ndarray, rows: list[tuple[int, bytes | None]], shape
    ) -> tuple[list[int], list[int]]:
        """Copy the usable blobs into target. Returns the rows with none of this model's
        space, and those whose blob is of the wrong size or not finite."""
        size = shape[0] * shape[1] * 4
        good = [(i, b) for i, b in rows if b is not None and len(b) == size]
        missing = [i for i, b in rows if b is None]
        invalid = [i for i, b in rows if b is not None and len(b) != size]
        if good:
            loaded = np.frombuffer(b"".join(b for _, b in good), "<f4").reshape(len(good), *shape)
            finite = np.isfinite(loaded).all(axis=(1, 2))
            idx = np.asarray([i for i, _ in good])
            target[idx[finite]] = loaded[finite]
            invalid += idx[~finite].tolist()
        return missing, invalid

    @staticmethod
    def _rebuild(states: UserStates, i: int, reason: str) -> str:
        """Row i has no usable h: replayed from its recent events when it has any (counted
        `replayed`), else it restarts from zero (counted by `reason`); what it counts as."""
        if states.recent[i]:
            states.replay.append(i)
            return "replayed"
        return reason

    def remember(self, p: int, seq: bytes, written: dict[str, CachedState]) -> None:
        """Cache the states a commit wrote (see `written`), at the sequence it moved the
        partition to."""
        self.cache.store(p, seq, written)


def _fresh_shadow(states: UserStates, shape: tuple[int, int]) -> ShadowStates:
    """The shadow model's states of users none of whose were read (all known: the known ones
    are copied in after)."""
    n = len(states.users)
    return ShadowStates(np.zeros((n, *shape), np.float32), states.last_ts.copy(),
                        score=np.full(n, np.nan), rules=[b""] * n)  # fmt: skip


# An HMGET of FIELDS as RESP but for its key: packed once, not each time (hiredis's
# pack_command took ~6 µs for its 17 arguments; the key put in between, ~0.6)
_HMGET_HEAD = b"*%d\r\n$5\r\nHMGET\r\n" % (2 + len(FIELDS))
_HMGET_FIELDS = b"".join(b"$%d\r\n%s\r\n" % (len(f), f.encode()) for f in FIELDS)


def hmgets_of(keys: list[str]) -> list[bytes]:
    """The HMGET of FIELDS of each state key, as RESP."""
    out = []
    for key in keys:
        raw = key.encode()
        out.append(b"%s$%d\r\n%s\r\n%s" % (_HMGET_HEAD, len(raw), raw, _HMGET_FIELDS))
    return out


def _replies(client: redis.Redis, read: StateRead) -> list:
    """A read's replies, sent on a pooled connection of `client`, errors as values."""
    return packed_replies(client, read.packed, read.replies)
