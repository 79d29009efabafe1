"""A node's batches at low traffic, together: their users' states read in one round trip and
their commits sent in two for all, where one after another each would cost its own.

At low traffic a round reads a few entries of each partition; sent one partition after
another, each batch's state read and commit (adapters/commit.py: the checks, then the
transaction) would make the latency grow with the partitions a worker holds. Here the state
reads of all go on one connection, and each commit keeps a connection of its own (a WATCH
is its connection's, and EXEC ends every WATCH of its connection): the checks of every
commit are sent before any reply is read, then each commit's transaction (or UNWATCH) once
its checks are judged, then the transactions' replies are read. So each commit's checks,
refusal and outcome are its own, as when it is sent alone: a refusal, a conflict, an error
reply or a lost connection of one leaves the others as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from worker.common.connection import read_replies
from worker.engine.adapters.commit import (
    CommitRefusedError,
    CommitResult,
    Committer,
    PreparedCommit,
    Sent,
)
from worker.engine.adapters.states import PartitionDataError, StateReader
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.user_states import UserStates, distinct_users

Outcome = CommitResult | CommitRefusedError | redis.RedisError


class Together:
    """Reads a node's batches' states at once and sends their commits at once."""

    def __init__(self, states: StateReader, committer: Committer) -> None:
        self.states = states
        self.committer = committer

    def read_states(
        self, client: redis.Redis, batches: list[Batch], shape: tuple[int, int], space: str,
        shadow: tuple[tuple[int, int], str] | None = None,
    ) -> list[UserStates | None]:  # fmt: skip
        """Each batch's users' states (as StateReader.read), their reads sent together on
        one connection of `client`; None for a batch whose read failed (a redirect, bad
        data) or whose cached states moved: it is read again alone, which says why."""
        requests = [self.states.request(b.partition, distinct_users(b)) for b in batches]
        reads = [self.states.command(request) for request in requests]
        pool = client.connection_pool
        conn = pool.get_connection()
        try:
            packed = [read.packed for read in reads if read is not None]
            if packed:
                conn.send_packed_command([b"".join(packed)])
            replies = [read_replies(conn, read.replies) if read else None for read in reads]
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            pool.release(conn)
        out: list[UserStates | None] = []
        for request, reply in zip(requests, replies, strict=True):
            try:
                flat = self.states.flat(request.partition, reply) if reply is not None else None
            except (redis.ResponseError, PartitionDataError):
                out.append(None)
                continue
            out.append(self.states.complete(request, flat, shape, space, shadow))
        return out

    def commit(
        self, client: redis.Redis, commits: list[tuple[Commit, PreparedCommit | None]]
    ) -> list[Outcome]:
        """Apply commits of distinct partitions of `client`'s node (see the module's
        docstring): for each, its result, its refusal, or the error it met (an error reply
        with every reply read, or a connection error that leaves it unsettled: it may have
        applied)."""
        pool = client.connection_pool
        outcomes: list = [None] * len(commits)
        conns: list[redis.connection.Connection] = []
        checks = [self.committer.checks(c) for c, _ in commits]
        try:
            conns = [pool.get_connection() for _ in commits]
            for i, (packed, _) in enumerate(checks):
                _step(outcomes, conns, i, conns[i].send_packed_command, [packed])
            # packed while Redis runs the checks, rather than between their replies
            commits = [(c, prepared or self.committer.prepare(c)) for c, prepared in commits]
            for i, ((c, prepared), (_, n)) in enumerate(zip(commits, checks, strict=True)):
                _step(outcomes, conns, i, self._judged, conns[i], c, prepared, n)
            for i in range(len(commits)):
                if isinstance(outcomes[i], Sent):
                    _step(outcomes, conns, i, self.committer.read_writes, conns[i], outcomes[i])
        except BaseException:
            for conn in conns:
                conn.disconnect()  # replies may still be in flight on them
            raise
        finally:
            for conn in conns:
                pool.release(conn)
        return outcomes

    def _judged(
        self, conn: redis.connection.Connection, c: Commit, prepared: PreparedCommit | None,
        n: int,
    ) -> Sent | CommitResult | CommitRefusedError:  # fmt: skip
        """The checks' replies read and judged: the transaction sent, or the verdict."""
        return self.committer.send_writes(conn, c, prepared, read_replies(conn, n))


def _step(outcomes: list, conns: list, i: int, action: Callable, *args: object) -> None:
    """Run commit i's next step on its connection, unless it already has an outcome; an
    error becomes its outcome (its connection dropped unless every reply was read)."""
    if isinstance(outcomes[i], Exception | CommitResult):
        return
    try:
        outcomes[i] = action(*args)
    except redis.ResponseError as exc:
        outcomes[i] = exc  # every reply was read: the connection stays usable
    except redis.RedisError as exc:
        conns[i].disconnect()
        outcomes[i] = exc
