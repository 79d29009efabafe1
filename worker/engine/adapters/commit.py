"""The atomic, conditional commit of one partition batch (docs/contract.md, User state and
scores out): the checks as plain reads under WATCH, then every write in one MULTI/EXEC.

Two round trips on one connection (the first rides with the reads ahead, engine/readahead.py):

  1. WATCH of the partition's lease, sequence, scores and dead-letter streams (and actions
     stream, when the commit writes actions), then the checks: the lease's holder, the
     partition's position (`acked`: its last commit's last entry), the entries between it
     and the batch, the sequence, the types of the streams written, the partition's last
     commit token (and the server's time, for a partition's first sequence);
  2. when every check passes, MULTI, the writes, EXEC; when one fails, UNWATCH and nothing
     is written. The writes: the score entries, the actions the intent rules fired, the dead
     letters, the partition's position and commit token, the users' states (their rule
     states with them), the sequence's INCR.

A failed check says why (CommitRefusedError):

    not_owned    the partition's lease is another process's (or gone)
    not_next     the partition's last commit is not the entry the batch follows (another
                 commit landed since it was read, or an earlier send of another commit)
    behind       the batch starts at or below the partition's position (the group was moved
                 back, `XGROUP SETID ... 0`): applied before, never applied again, and the
                 position never moves backwards
    gap          entries lie between the partition's last commit and the batch (read by
                 another reader of the group, say a paused worker past its lease): they must
                 be applied first, or a user's later event would make them look applied
    conflict     a commit of the partition landed since the states were read (or a watched
                 key changed between the checks and EXEC)
    bad_key      a scores, actions, dead-letter, position or sequence key holds data of
                 another type

and one success besides a plain one: `applied`, when this very commit was applied by an
earlier send whose reply was lost (the caller sends it again after an outage): the
partition's position is the batch's last entry and its last commit token is this commit's.

Why all or nothing: EXEC runs the queued writes only if no watched key changed since the
WATCH, so what the checks saw still holds when the writes run (another commit bumps the
sequence; a take-over writes the lease; no entry can appear between two existing ones). A
slot that moved fails the queueing (MOVED, ASK) and EXEC discards the transaction. The writes
cannot fail on data but one way: a user's state key that an operator overwrote with another
type. Its HSET fails alone, as if the operator's write had come just after the commit, and
the key is replaced by the state at once, in a transaction of its own under the sequence the
commit set (`replaced`). Why not a Lua script: taking a script's arguments as Lua strings
(each byte hashed) and each redis.call cost Redis about half again what the same writes cost
as commands (BENCHMARKS.md, The commit's Redis CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import hiredis
import numpy as np
import redis

from worker.common.connection import is_cluster, read_replies, refresh_topology
from worker.common.entry_ids import entry_id
from worker.common.keys import Keys
from worker.engine.adapters.commit_commands import PartitionCommands
from worker.engine.adapters.commit_token import position_of, token_of
from worker.engine.adapters.nodes import REDIRECTS, PartitionNodes
from worker.engine.adapters.resp import bulk, chunks, packed, resp_commands
from worker.engine.adapters.row_writes import scores_template, state_writes
from worker.engine.compute.parts.part import Rows, decimals
from worker.engine.compute.pipeline import Commit

REASONS = ("not_owned", "not_next", "behind", "gap", "conflict", "bad_key")


class CommitRefusedError(Exception):
    """The commit applied nothing; `reason` is one of REASONS, `detail` the script's word."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class CommitResult:
    """A commit that took effect: the partition's new sequence and the state keys of
    another type it replaced (0 when the reply is `applied`: the count went with the
    lost reply)."""

    seq: bytes
    replaced: int
    resent: bool  # True when an earlier send had applied it
    previous: bytes = b""  # the token of the partition's commit before this one


@dataclass(frozen=True)
class CommitLimits:
    """Sizes the commit bounds its writes to (settings)."""

    scores_maxlen: int
    deadletter_maxlen: int
    deadletter_max_value_bytes: int
    state_ttl_ms: int


MULTI, EXEC, UNWATCH = (hiredis.pack_command((x,)) for x in ("MULTI", "EXEC", "UNWATCH"))
_TIME = hiredis.pack_command(("TIME",))
_STREAM_TYPES = (b"stream", b"none")  # what TYPE answers for a stream key, or none yet


@dataclass(frozen=True)
class PreparedCommit:
    """A commit's transaction packed but for its end (which depends on the sequence read,
    known only once the commit before it replied), and where its replies of interest sit in
    EXEC's."""

    body: list  # the writes: bytes-like chunks, sent as they are (resp.chunks)
    n_writes: int  # commands queued by body
    previous_at: int  # the GET of the partition's last commit token
    states_at: int  # the first state HSET; one per state row from there, in `state_rows`
    state_rows: np.ndarray  # int64


@dataclass(frozen=True)
class Verdict:
    """What the checks decided: go on with the writes (result None), or a result without
    them (`applied`, a refusal, or an error reply to raise)."""

    result: CommitResult | CommitRefusedError | redis.ResponseError | None
    seed: bytes = b""  # the partition's first sequence, from the server's time
    entries: int = 0  # the partition's count of entries committed before this commit


@dataclass(frozen=True)
class Sent:
    """A transaction sent whose replies are still to be read."""

    commit: Commit
    prepared: PreparedCommit
    replies: int


class Committer:
    """Packs Commits for one worker process and applies them."""

    def __init__(
        self, client: redis.Redis, keys: Keys, holder: str, limits: CommitLimits,
        layout: str = "full", nodes: PartitionNodes | None = None,
    ) -> None:  # fmt: skip
        self.client = client
        self.lean = layout == "lean"  # docs/contract.md, The lean layout
        self.keys = keys
        self.holder = holder
        self._holder = holder.encode()  # as the lease's GET answers it
        self.limits = limits
        self.nodes = nodes or PartitionNodes(client, keys)
        # the commands a partition's every commit sends as they are, packed once
        self._constant: dict[tuple[int, tuple[str, ...]], PartitionCommands] = {}
        self._constant_limits = limits

    def token(self, commit: Commit) -> bytes:
        """The token this commit records as the partition's last commit."""
        return token_of(self.holder, commit)

    def applied(self, p: int, token: bytes) -> bool:
        """Whether the partition's last commit is the one that recorded `token` (a commit
        whose reply was lost)."""
        return self.client.get(self.keys.last_commit(p)) == token

    # ---- 1. the checks ------------------------------------------------------------------

    def checks(self, c: Commit) -> tuple[bytes, int]:
        """The WATCH and the check reads of a Commit as RESP, and the number of replies: WATCH
        (the lease, the sequence, the streams written), GET the lease and the position, the
        XRANGE of entries between, GET the sequence, TYPE of each stream, GET the last commit
        token and the count of entries committed, TIME on the partition's first commit."""
        # the partition's first commit: its sequence starts from the clock
        return self.checks_of(c.partition, tuple(self.streams(c)), c.after, c.ack_ids[0],
                              clock=c.seq == b"")  # fmt: skip

    def checks_of(
        self, p: int, streams: tuple[str, ...], after: bytes, first: bytes, clock: bool
    ) -> tuple[bytes, int]:
        """`checks` of a commit of partition p writing `streams`, of a batch that follows
        `after` from its entry `first`, with the server's time read last when `clock`."""
        constant = self._constant_of(p, streams)
        checks = constant.checks_head + constant.between(after, first) + constant.checks_tail
        return (checks + _TIME, constant.checks + 1) if clock else (checks, constant.checks)

    def _constant_of(self, p: int, streams: tuple[str, ...]) -> PartitionCommands:
        """The partition's commands that every commit writing `streams` sends as they are."""
        if self._constant_limits is not self.limits:  # packed with other limits
            self._constant, self._constant_limits = {}, self.limits
        found = self._constant.get((p, streams))
        if found is None:
            found = self._constant[(p, streams)] = PartitionCommands.of(
                self.keys, p, streams, self.limits.scores_maxlen
            )
        return found

    def streams(self, c: Commit) -> list[str]:
        """The streams the commit writes: its scores', then each part's (dead letters,
        actions, ...); watched, their types checked."""
        k, p = self.keys, c.partition
        return [k.scores(p), *(key for part in c.parts for key in part.watched(k, p))]

    def verdict(self, c: Commit, replies: list) -> Verdict:
        """The checks' replies judged in the order of the module's docstring."""
        for reply in replies:
            if isinstance(reply, REDIRECTS):
                return Verdict(reply)  # the node does not serve the slot: nothing was read
        if isinstance(replies[0], redis.ResponseError):
            return Verdict(replies[0])  # no WATCH (an ACL without it): never write unwatched
        clock = 1 if c.seq == b"" else 0  # the TIME read last
        lease, at, between, seq = replies[1:5]
        types, token = replies[5 : len(replies) - 2 - clock], replies[-2 - clock]
        entries = replies[-1 - clock]  # the partition's count of entries committed
        if lease != self._holder:
            return Verdict(CommitRefusedError("not_owned", ""))
        if isinstance(at, redis.ResponseError):
            return Verdict(CommitRefusedError("bad_key", self.keys.acked(c.partition)))
        at = position_of(at, token)
        if at is None:
            return Verdict(CommitRefusedError("bad_key", self.keys.acked(c.partition)))
        if at != c.after:
            if at == c.ack_ids[-1] and token == self.token(c):
                applied = seq if isinstance(seq, bytes) else b""
                return Verdict(CommitResult(applied, 0, resent=True))
            return Verdict(CommitRefusedError("not_next", at.decode()))
        if entry_id(c.ack_ids[0]) <= entry_id(at):
            return Verdict(CommitRefusedError("behind", at.decode()))
        if isinstance(between, redis.ResponseError):
            return Verdict(between)  # the events key holds another type
        if between:
            return Verdict(CommitRefusedError("gap", between[0][0].decode()))
        if isinstance(seq, redis.ResponseError) or (seq is not None and not seq.isdigit()):
            return Verdict(CommitRefusedError("bad_key", self.keys.commit_seq(c.partition)))
        if (seq or b"") != c.seq:
            return Verdict(CommitRefusedError("conflict", (seq or b"").decode()))
        if any(kind not in _STREAM_TYPES for kind in types):  # the key named only then
            for key, kind in zip(self.streams(c), types, strict=True):
                if kind not in _STREAM_TYPES:
                    return Verdict(CommitRefusedError("bad_key", key))
        # a count of another kind (an operator's write) restarts from this commit's
        entries = int(entries) if isinstance(entries, bytes) and entries.isdigit() else 0
        if clock:
            seconds, micros = replies[-1]
            return Verdict(None, seconds + b"%06d" % int(micros), entries)
        return Verdict(None, entries=entries)

    # ---- 2. the writes ------------------------------------------------------------------

    def prepare(self, c: Commit) -> PreparedCommit:
        """The writes of a Commit as RESP (`transaction` adds MULTI and the rest), in this
        order: score entries, each part's stream writes (dead letters, actions), the
        partition's position, last commit token (GET, then SET), the state keys rewritten
        whole (DEL), the states (HSET), each part's state writes (the shadow model's), their
        TTL."""
        text = decimals(c.scores)
        return self.prepared(c, [self._scores(c, text)], self._state_writes(c, text))

    def prepared(
        self, c: Commit, scores: list, states: tuple[list, int, int, np.ndarray]
    ) -> PreparedCommit:  # fmt: skip
        """The PreparedCommit of `c` from its score entries' XADDs (bytes-like chunks) and its
        state writes (as `_state_writes` gives them), the rest packed here, in `prepare`'s
        order: one place for the order the replies are read in (group_packing.py too)."""
        parts, n = [*scores], len(c.scores)
        if n:
            parts.append(self._constant_of(c.partition, ()).trim_scores)
            n += 1
        written, n_written = self._stream_writes(c)
        parts += [*written, *self._position_writes(c)]
        previous_at, n = n + n_written + 1, n + n_written + 3
        writes, n_states, first_hset, rows = states
        return PreparedCommit(chunks([*parts, *writes]), n + n_states, previous_at,
                              n + first_hset, rows)  # fmt: skip

    def _stream_writes(self, c: Commit) -> tuple[list, int]:
        """Each part's stream writes (dead letters, actions) and their number of commands."""
        k, p, lim = self.keys, c.partition, self.limits
        out, n = [], 0
        for part in c.parts:
            for command in part.writes(k, p, lim):
                if isinstance(command, Rows):
                    out.append(resp_commands(command.template))
                    n += command.n
                else:
                    out.append(packed(*command))
                    n += 1
        return out, n

    def _position_writes(self, c: Commit) -> list[bytes]:
        """The partition's position, and its last commit token (GET, then SET)."""
        constant = self._constant_of(c.partition, ())
        return [constant.set_acked + bulk(c.ack_ids[-1]), constant.get_last_commit,
                constant.set_last_commit + bulk(self.token(c))]  # fmt: skip

    def _scores(self, c: Commit, text: list[str]) -> bytes:
        """The score entries' XADDs (`scores_template`)."""
        return resp_commands(scores_template(c, text, self.keys.scores(c.partition), self.lean))

    def _state_writes(
        self, c: Commit, text: list[str], rows: np.ndarray | None = None, replace: bool = False
    ) -> tuple[list, int, int, np.ndarray]:
        """The state writes of the rows given (default: every row), as `state_writes` gives
        them; the DELs of c.rewrite's rows, or of every row given when `replace`."""
        if not c.users:
            return [], 0, 0, np.zeros(0, np.int64)
        rows = np.arange(len(c.users)) if rows is None else rows
        rows = np.asarray(rows, np.int64)
        keys = list(map(self.keys.state_prefix(c.partition).__add__, c.users))  # keys.state(p, u)
        dels = rows if replace else np.asarray(c.rewrite, np.int64)
        return state_writes(c, keys, text, rows, dels, self.lean, self.limits.state_ttl_ms)

    def transaction(
        self, c: Commit, prepared: PreparedCommit | None = None, seed: bytes = b"",
        entries: int = 0,
    ) -> tuple[list, int]:  # fmt: skip
        """The whole transaction as RESP chunks (from `prepared` when given): MULTI, the
        writes, the partition's count of entries committed (`entries` before it, read by
        the checks, plus the batch's: the sequence, watched, guards it), the sequence's
        first value `seed` when it has none, its INCR, EXEC; and the number of replies it
        gets."""
        writes, n = self.writes(c, prepared, seed, entries)
        return [MULTI, *writes[:-1], writes[-1] + EXEC], n + 2

    def writes(
        self, c: Commit, prepared: PreparedCommit | None = None, seed: bytes = b"",
        entries: int = 0,
    ) -> tuple[list, int]:  # fmt: skip
        """The transaction's writes (`transaction` without MULTI and EXEC) as RESP chunks,
        and their number: what a commit queues, alone or beside others (together.py)."""
        prepared = prepared or self.prepare(c)
        constant = self._constant_of(c.partition, ())
        count = constant.set_committed + bulk(b"%d" % (entries + len(c.ack_ids)))
        # the partition's first commit: its sequence starts from the server's time
        start = packed("SET", self.keys.commit_seq(c.partition), seed) if seed else b""
        end = count + start + constant.incr_seq
        return [*prepared.body, end], prepared.n_writes + (2 if seed else 1) + 1

    def _outcome(self, c: Commit, prepared: PreparedCommit, replies: list) -> tuple:
        """(result, the state rows whose HSET failed) from MULTI's, the QUEUED and EXEC's
        replies; CommitRefusedError("conflict") when a watched key changed, the first
        queueing error (a redirect, OOM) raised."""
        queued = replies[1:-1]
        for reply in [replies[0], *queued]:
            if isinstance(reply, redis.ResponseError):
                raise reply
        done = replies[-1]
        if done is None:
            return CommitRefusedError("conflict", "a watched key changed"), []
        if isinstance(done, redis.ResponseError):
            raise done
        seq = b"%d" % done[-1]
        previous = done[prepared.previous_at]
        hsets = done[prepared.states_at : prepared.states_at + len(prepared.state_rows)]
        failed = []
        if set(map(type, hsets)) - {int}:  # a state key of another type (scanned in C first)
            failed = [int(prepared.state_rows[i]) for i, reply in enumerate(hsets)
                      if isinstance(reply, redis.ResponseError)]  # fmt: skip
        previous = previous if isinstance(previous, bytes) else b""
        return CommitResult(seq, len(failed), False, previous), failed

    # ---- both round trips ---------------------------------------------------------------

    def finish(
        self, conn: redis.connection.Connection, c: Commit, prepared: PreparedCommit | None,
        check_replies: list, during=None,
    ) -> CommitResult | CommitRefusedError:  # fmt: skip
        """Round trip 2 on `conn`, after the checks' replies: the writes when every check
        passed (calling `during()` while Redis runs them), else UNWATCH. The result, or the
        refusal; an error reply of a check or of the queueing (a redirect) raised, with every
        reply read (the connection stays usable)."""
        sent = self.send_writes(conn, c, prepared, check_replies)
        if not isinstance(sent, Sent):
            return sent
        if during is not None:
            during()
        return self.read_writes(conn, sent)

    def send_writes(
        self, conn: redis.connection.Connection, c: Commit, prepared: PreparedCommit | None,
        check_replies: list,
    ) -> Sent | CommitResult | CommitRefusedError:  # fmt: skip
        """The transaction sent when the checks passed (its replies not read yet), else
        UNWATCH and the verdict's result."""
        verdict = self.verdict(c, check_replies)
        if verdict.result is not None:
            conn.send_packed_command([UNWATCH])
            conn.read_response()
            if isinstance(verdict.result, redis.ResponseError):
                raise verdict.result
            return verdict.result
        prepared = prepared or self.prepare(c)
        command, n = self.transaction(c, prepared, verdict.seed, verdict.entries)
        if sum(map(len, command)) < 65536:  # one send (a system call) rather than one a chunk
            command = [b"".join(command)]
        conn.send_packed_command(command)
        return Sent(c, prepared, n)

    def read_writes(
        self, conn: redis.connection.Connection, sent: Sent
    ) -> CommitResult | CommitRefusedError:
        """The replies of a transaction sent; state keys of another type replaced."""
        return self.settled(conn, sent.commit, sent.prepared, read_replies(conn, sent.replies))

    def settled(
        self, conn: redis.connection.Connection, c: Commit, prepared: PreparedCommit,
        replies: list,
    ) -> CommitResult | CommitRefusedError:  # fmt: skip
        """The outcome of a commit's transaction from MULTI's, its QUEUED and EXEC's replies
        (of its writes only, when it went with others); state keys of another type replaced
        on `conn`."""
        result, failed = self._outcome(c, prepared, replies)
        if failed:
            self._replace(conn, c, failed, result.seq)
        return result

    def _replace(
        self, conn: redis.connection.Connection, c: Commit, rows: list[int], seq: bytes
    ) -> None:
        """Replace the state keys of these rows, found of another type by the commit, by the
        states it computed (DEL, HSET, the shadow's HSET, PEXPIRE), if the partition's
        sequence is still the one it set: else a later commit read them, found them invalid
        and wrote them itself."""
        seq_key = self.keys.commit_seq(c.partition)
        conn.send_packed_command([packed("WATCH", seq_key) + packed("GET", seq_key)])
        conn.read_response()
        if conn.read_response() != seq:
            conn.send_packed_command([UNWATCH])
            conn.read_response()
            return
        writes, n, _, _ = self._state_writes(c, decimals(c.scores), np.asarray(rows), True)
        conn.send_packed_command(chunks([MULTI, *writes, EXEC]))
        read_replies(conn, n + 2)

    def run(self, commit: Commit, node: redis.Redis | None = None) -> CommitResult:
        """Apply a Commit (both round trips on a pooled connection); CommitRefusedError when
        it applied nothing. On a cluster it goes to `node`, else to the node that holds the
        partition by a fresh slot map, once more after a MOVED; ASK or TRYAGAIN (a slot
        migrating) is raised for the caller to retry later."""
        if not is_cluster(self.client):
            return self._on(self.client, commit)
        for attempt in range(3):
            if node is None:
                refresh_topology(self.client)
                node = self.nodes.client(commit.partition)
            try:
                return self._on(node, commit)
            except redis.exceptions.MovedError:
                if attempt == 2:
                    raise
                node = None
        raise AssertionError("unreachable")

    def _on(self, client: redis.Redis, commit: Commit) -> CommitResult:
        """Both round trips on a pooled connection of `client`."""
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            command, n = self.checks(commit)
            conn.send_packed_command([command])
            prepared = self.prepare(commit)  # while Redis runs the checks
            result = self.finish(conn, commit, prepared, read_replies(conn, n))
        except redis.ResponseError:
            raise  # every reply was read: the connection stays usable
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            pool.release(conn)
        if isinstance(result, CommitRefusedError):
            raise result
        return result
