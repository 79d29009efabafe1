"""Read-ahead: a commit pipelined, on one connection, with the reads that keep the next batch
known, and the next batch computed while Redis runs the commit.

One exchange, in this order on the wire:

  1. the reads, sent together: the upcoming batch's states (the sequence and an HMGET per
     user not known, or a GET of the sequence alone when all are known) and a
     non-blocking XREADGROUP of new entries of the partitions given; and behind them the
     commit's WATCH and checks (adapters/commit.py);
  2. their replies, read before the commit's writes are sent: the writes go only when the
     checks passed, and Redis sends the replies of commands it read together only after
     running them all, so reads sent with the writes would come back only after them. The
     writes are packed while Redis runs the reads and the checks (unless packed ahead);
  3. the commit's transaction; while Redis runs it this process parses the entries read and
     computes the upcoming batch from its states (an `Ahead`);
  4. the transaction's replies (`Exchange.settle`).

The upcoming batch's states are the ones Redis holds once the commit applied: those of the
users the commit writes come from the commit (`written`), the others from the read, which
must find the partition at the sequence the known states hold at. With no batch queued, the
first batch the read brings of the commit's partition is computed instead, when all its
states are known at the commit's sequence (cached or written by the commit): the commit
applies only at that sequence, so it vouches for them. The batch computed ahead is kept only
when the commit applied as sent (not a resend of an earlier send).

A reply that is an error fails its read alone (a stream of another type is found by the next
plain read; states that moved are read again in the batch's turn). Any other failure
disconnects, since a reply may still be in flight, and raises: the caller rewinds, so the
entries read stay pending for this consumer and are read again, in order.

On a Redis Cluster the exchange goes to the node that holds the commit's partition
(adapters/nodes.py), with the reads of that node's partitions only, one XREADGROUP each (a
command's keys share a slot). A node that no longer serves the commit's slot (a resharding,
a failover) answers MOVED, ASK or TRYAGAIN: the commit did not run, and the caller rewinds
and sends it again through `Committer.run`, which finds the slot's node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import hiredis
import redis

from model.scoring import ScoringModel
from worker.common.connection import read_replies, reply_or_error
from worker.common.keys import Keys
from worker.engine.adapters.commit import (
    UNWATCH,
    CommitRefusedError,
    CommitResult,
    Committer,
    PreparedCommit,
)
from worker.engine.adapters.early_checks import EarlyChecks, Watched
from worker.engine.adapters.states import (
    PartitionDataError,
    StateRead,
    StateReader,
    StateRequest,
)
from worker.engine.adapters.streams import Cursor, StreamReader
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.state_cache import CachedState, written
from worker.engine.compute.user_states import UserStates, distinct_users
from worker.engine.models import Models
from worker.rules.step import RuleTable


@dataclass(frozen=True)
class Plan:
    """The read of an upcoming batch's states, sent in front of a commit: the states' read,
    or the sequence's GET alone when all are known (`reads_states` False); None when the
    batch was just read and needs no read."""

    batch: Batch
    request: StateRequest
    read: StateRead | None
    reads_states: bool = False


@dataclass
class Ahead:
    """A batch computed while the commit before it ran: its states as read ahead (and as
    that commit wrote them), its Commit, packed but for the head, the models and the intent
    rules that computed it, and the stage times."""

    batch: Batch
    states: UserStates
    commit: Commit
    prepared: PreparedCommit
    model: ScoringModel
    shadow: ScoringModel | None
    seconds: tuple[float, float]  # reading states, computing the commit
    rules: RuleTable | None = None  # the intent rules it fired with


@dataclass(frozen=True)
class Computed:
    """A batch's Commit as the consumer's compute step made it: the states it read, the
    Commit, packed (when computed ahead), the seconds of reading states and computing,
    whether it was computed while the commit before it ran, and the connection its early
    checks went on (adapters/early_checks.py)."""

    states: UserStates
    commit: Commit
    prepared: PreparedCommit | None
    seconds: tuple[float, float]
    ahead: bool
    watched: Watched | None = None  # the connection that holds its early checks, if any


@dataclass(frozen=True)
class Read:
    """New entries read with a commit: the cursors each XREADGROUP read, their replies (an
    error reply as its exception), and the batches' size."""

    groups: list[list[Cursor]]
    replies: list
    size: int

    def batches(self, reader: StreamReader) -> list[Batch]:
        """The batches the reads brought (a read that failed brings none: the next plain
        read finds out why); parsing moves the cursors past them."""
        return [batch for group, reply in zip(self.groups, self.replies, strict=True)
                if not isinstance(reply, Exception)
                for batch in reader.batches(reply, group, self.size)]  # fmt: skip


@dataclass
class Exchange:
    """What one exchange brought back: the commit's result (or refusal), the batches read
    ahead, the states the commit writes, and the upcoming batch computed ahead (if it was)."""

    commit: Commit
    result: CommitResult | CommitRefusedError
    batches: list[Batch]
    written: dict[str, CachedState] | None  # None when not worked out (its writes not sent)
    ahead: Ahead | None

    def settle(self) -> CommitResult:
        """The commit's result (CommitRefusedError when it applied nothing); `ahead` is
        dropped when the result was of an earlier send, which it was not computed after."""
        result = self.result
        if isinstance(result, CommitRefusedError):
            raise result
        ahead = self.ahead
        if ahead is not None and result.resent:
            self.ahead = None
        elif ahead is not None and ahead.batch.partition == self.commit.partition:
            # read at the commit's sequence: it holds from the one the commit moved to
            ahead.commit.seq = ahead.states.seq = result.seq
        return result


class ReadAhead:
    """Sends a worker's commits pipelined with its reads ahead, and parses the replies."""

    def __init__(
        self, keys: Keys, states: StateReader, reader: StreamReader, committer: Committer,
        early: EarlyChecks | None = None,
    ) -> None:  # fmt: skip
        self.keys = keys
        self.states = states
        self.reader = reader
        self.committer = committer
        self.early = early or EarlyChecks(committer)

    def plan(self, commit: Commit, upcoming: Batch) -> Plan:
        """How to read the upcoming batch's states in front of `commit`, which applies
        before it: the states of the commit's users are the ones it writes."""
        p, users = upcoming.partition, distinct_users(upcoming)
        if p == commit.partition:
            request = self.states.request(
                p, users, in_flight=set(commit.users), in_flight_seq=commit.seq
            )
        else:
            request = self.states.request(p, users)
        read = self.states.command(request)
        if read is not None:
            return Plan(upcoming, request, read, reads_states=True)
        # all known: reading the sequence checks they still hold
        return Plan(upcoming, request, StateRead(_packed_get(self.keys.commit_seq(p)), 1))

    def exchange(
        self, node: redis.Redis, commit: Commit, prepared: PreparedCommit | None,
        plan: Plan | None, cursors: list[Cursor], count: int, size: int, models: Models,
    ) -> Exchange:  # fmt: skip
        """One exchange (see the module's docstring) with `node`, which holds the commit's
        partition, plan's and cursors': the states of `plan`, up to `count` new entries of
        `cursors` (as batches of at most `size`), then the commit, during which `models`
        compute the planned batch. A REDIRECTS error when the node no longer serves the
        commit's slot."""
        state_read = plan.read if plan is not None else None
        groups, new = self.new_entries(cursors, count)
        checks, n_checks = self.committer.checks(commit)
        pool = node.connection_pool
        conn = pool.get_connection()
        try:
            # one bytes, one send: redis-py makes a system call of each item of the list
            conn.send_packed_command([b"".join([state_read.packed if state_read else b"", new,
                                                checks])])  # fmt: skip
            # while Redis runs the reads and the checks: the states the commit writes, and
            # its writes packed (after the checks' reply they were on the way to EXEC)
            in_flight = written(commit)
            prepared = prepared or self.committer.prepare(commit)
            state_replies = read_replies(conn, state_read.replies) if state_read else []
            read = Read(groups, [reply_or_error(conn) for _ in groups], size)
            check_replies = read_replies(conn, n_checks)
            result, batches, ahead, in_flight = self._finish(
                conn, commit, prepared, check_replies, read, plan, state_replies, in_flight,
                models,
            )  # fmt: skip
        except redis.ResponseError:
            raise  # every reply was read: the connection stays usable (a redirect, above)
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            pool.release(conn)
        return Exchange(commit, result, batches, in_flight, ahead)

    def new_entries(self, cursors: list[Cursor], count: int) -> tuple[list[list[Cursor]], bytes]:
        """The reads of up to `count` new entries of `cursors` (non-blocking): the cursors
        each reads, and the reads packed."""
        groups = self.reader.read_groups(cursors)
        packed = b"".join(self.reader.packed_read(g, count, None) for g in groups)
        return groups, packed

    def exchange_watched(
        self, watched: Watched, commit: Commit, prepared: PreparedCommit | None,
        size: int, models: Models,
    ) -> Exchange:  # fmt: skip
        """A cold batch's commit on the connection that holds its early checks
        (adapters/early_checks.py), its checks sent again first (behind an UNWATCH) when the
        early ones are not its own; while Redis runs it, the entries read with its states
        (watched.groups', in batches of at most `size`) are parsed and the first batch of the
        commit's partition is computed when all its states are known (as `exchange`)."""
        conn = watched.conn
        try:
            check_replies = self.early.replies(watched, commit)
            if check_replies is None:
                checks, n = self.committer.checks(commit)
                conn.send_packed_command([UNWATCH + checks])
                check_replies = read_replies(conn, n + 1)[1:]
            prepared = prepared or self.committer.prepare(commit)
            read = Read(watched.groups, watched.reads, size)
            # the states it writes are worked out while Redis runs it, not on the way to EXEC
            result, batches, ahead, in_flight = self._finish(
                conn, commit, prepared, check_replies, read, None, [], None, models
            )
        except redis.ResponseError:
            raise  # every reply was read: the connection stays usable
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            watched.release()
        return Exchange(commit, result, batches, in_flight, ahead)

    def _finish(
        self, conn: redis.connection.Connection, commit: Commit, prepared: PreparedCommit,
        check_replies: list, read: Read, plan: Plan | None, state_replies: list,
        in_flight: dict[str, CachedState] | None, models: Models,
    ) -> tuple[
        CommitResult | CommitRefusedError, list[Batch], Ahead | None,
        dict[str, CachedState] | None,
    ]:  # fmt: skip
        """The commit's transaction (`Committer.finish`); while Redis runs it, the states the
        commit writes worked out (`in_flight`, unless given), the entries `read` brought
        parsed and the upcoming batch computed (`_ahead`). Its result, the batches read, the
        batch computed ahead (None when it was refused) and the states (None when the writes
        were not sent)."""
        parsed: list[list[Batch]] = []
        ahead: Ahead | None = None

        def while_redis_writes() -> None:
            nonlocal ahead, in_flight
            if in_flight is None:
                in_flight = written(commit)
            parsed.append(read.batches(self.reader))
            ahead = self._ahead(commit, plan, state_replies, parsed[0], in_flight, models)

        result = self.committer.finish(conn, commit, prepared, check_replies,
                                       during=while_redis_writes)  # fmt: skip
        return result, parsed[0] if parsed else read.batches(self.reader), ahead, in_flight

    def _ahead(
        self, commit: Commit, plan: Plan | None, state_replies: list, batches: list[Batch],
        in_flight: dict[str, CachedState], models: Models,
    ) -> Ahead | None:  # fmt: skip
        """The upcoming batch computed from what the exchange read: the planned one from its
        states' read, else the first batch just read of the commit's partition when all its
        states are known (_known); None when neither can be (a read that failed is made
        again in the batch's turn, which says why)."""
        if plan is None:
            known = self._known(commit, batches)
            return self._compute(known, None, in_flight, models) if known is not None else None
        if not plan.reads_states:
            seq = state_replies[0]
            if isinstance(seq, Exception) or (seq or b"") != plan.request.seq:
                return None
            return self._compute(plan, None, in_flight, models)
        try:
            flat = self.states.flat(plan.batch.partition, state_replies)
        except (redis.ResponseError, PartitionDataError):
            return None
        return self._compute(plan, flat, in_flight, models)

    def _known(self, commit: Commit, batches: list[Batch]) -> Plan | None:
        """The first batch just read of the commit's partition, when every state it needs
        is known at the commit's sequence: the commit applies only at that sequence, so if
        it applies they hold, and the batch is computed now rather than a round later."""
        batch = next((b for b in batches if b.partition == commit.partition), None)
        if batch is None or not batch.users:
            return None
        request = self.states.request(
            batch.partition, distinct_users(batch), in_flight=set(commit.users),
            in_flight_seq=commit.seq,
        )  # fmt: skip
        return Plan(batch, request, None) if self.states.command(request) is None else None

    def _compute(
        self, plan: Plan, flat: list | None, in_flight: dict[str, CachedState], models: Models
    ) -> Ahead | None:
        """The planned batch computed from its states read ahead (`flat`, the read's flat
        replies) and those the commit in flight writes; None when the states moved since (it
        is then computed the usual way, in its turn)."""
        t1 = time.perf_counter()
        model, shadow = models.current, models.shadow
        states = self.states.complete(plan.request, flat, *models.spec(), in_flight=in_flight)
        if states is None:
            return None
        t2 = time.perf_counter()
        commit = models.build(plan.batch, states)
        prepared = self.committer.prepare(commit)
        return Ahead(plan.batch, states, commit, prepared, model, shadow,
                     (t2 - t1, time.perf_counter() - t2), models.rules)  # fmt: skip


def _packed_get(key: str) -> bytes:
    """GET of a key as RESP."""
    return hiredis.pack_command(("GET", key))
