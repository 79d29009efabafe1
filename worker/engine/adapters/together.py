"""A node's batches at low traffic, together: their users' states read in one round trip and
their commits sent in two for all, where one after another each would cost its own.

At low traffic a round reads a few entries of each partition; sent one partition after
another, each batch's state read and commit (adapters/commit.py: the checks, then the
transaction) would make the latency grow with the partitions a worker holds. Here the state
reads of all go on one connection, and the commits go in two round trips for all:

- On one Redis, one connection: every commit's WATCH and checks in one send; then one
  transaction holding the writes of each commit whose checks passed (a refused one is left
  out, its verdict its own), each commit's outcome read from its own replies within EXEC's.
  Commits built as one group (`whole`: compute/joint.py, the group's sums on its first)
  go all or none: when one is refused, the others are withheld and sent again alone. Their
  writes are packed at once while Redis runs the checks.
  Each commit stays all or nothing (they all do together); a watched key that changed
  before EXEC refuses them all as a conflict (each is computed and sent again), and a lost
  connection leaves them all unsettled (each counted once Redis shows it applied). One
  send and one reply a round trip, where a connection each cost a system call each on both
  sides, which grew with the partitions on a loaded 2-core machine.
- On a cluster (a transaction holds the keys of one slot), a connection per commit (a WATCH
  is its connection's, and EXEC ends every WATCH of its connection): the checks of every
  commit are sent before any reply is read, then each commit's transaction (or UNWATCH) once
  its checks are judged, then the transactions' replies are read. So each commit's checks,
  refusal and outcome are its own, as when it is sent alone: a refusal, a conflict, an
  error reply or a lost connection of one leaves the others as they are. The reads and the
  commits run as steps (`read_states_steps`, `commit_steps`) that yield where they have sent
  and would wait, so a round's nodes are interleaved (flow.together_on_nodes): every node's
  sends of a phase go before any node waits for its replies.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from itertools import accumulate
from typing import Any

import redis

from worker.common.connection import read_replies
from worker.engine.adapters.commit import (
    EXEC,
    MULTI,
    UNWATCH,
    CommitRefusedError,
    CommitResult,
    Committer,
    PreparedCommit,
    Sent,
)
from worker.engine.adapters.early_checks import EarlyChecks, Watched
from worker.engine.adapters.resp import chunks
from worker.engine.adapters.states import PartitionDataError, StateReader
from worker.engine.compute.batch import Batch
from worker.engine.compute.deferred import complete
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.user_states import distinct_users


class Withheld:
    """A commit not sent: its group goes all or none, and another of it was refused."""


WITHHELD = Withheld()

Outcome = CommitResult | CommitRefusedError | redis.RedisError | Withheld
# packs a group's commits at once (adapters/group_packing.py), None when it cannot
Packing = Callable[[], list[PreparedCommit] | None]


class Together:
    """Reads a node's batches' states at once and sends their commits at once."""

    def __init__(
        self, states: StateReader, committer: Committer, one_transaction: bool,
        early: EarlyChecks | None = None,
    ) -> None:  # fmt: skip
        self.states = states
        self.committer = committer
        # the checks of commits sent with their states' reads (one Redis)
        self.early = early or EarlyChecks(committer)
        # one Redis: the commits whose checks pass go in one transaction on one connection
        # (a cluster's transaction holds the keys of one slot: a connection per commit)
        self.one_transaction = one_transaction

    def read_states_steps(
        self, client: redis.Redis, batches: list[Batch], shape: tuple[int, int], space: str,
        shadow: tuple[tuple[int, int], str] | None = None,
    ) -> Steps:  # fmt: skip
        """Each batch's users' states (as StateReader.read), their reads sent together on
        one connection of `client`; None for a batch whose read failed (a redirect, bad
        data) or whose cached states moved: it is read again alone, which says why. And,
        when every batch's were read, all of them as one (the batches' are its views). As
        steps: it yields once the reads are sent, before it waits for their replies (other
        nodes' reads go meanwhile: flow.together_on_nodes); returns (each batch's states,
        all of them or None, the connection that holds their commits' early checks or
        None). On one Redis every batch's commit checks go in front of the reads
        (adapters/early_checks.py), so the commits then need one round trip, not two; when
        every state is known nothing is sent (the checks go after the build, as alone)."""
        requests = [self.states.request(b.partition, distinct_users(b)) for b in batches]
        reads = self.states.commands(requests)
        if all(read is None for read in reads):
            # every state known: nothing to wait for before the build, and the commits'
            # checks go after it, their writes packed while Redis runs them (sent early,
            # the build and the packing would both wait for the checks' round trip)
            joined = self.states.complete_all(requests, [None] * len(requests), shape, space,
                                              shadow)  # fmt: skip
            if joined is not None:
                return list(joined[1]), joined[0], None
        pool = client.connection_pool
        conn = pool.get_connection()
        early = [self.early.of(b) for b in batches] if self.one_transaction else []
        watched = Watched(client, conn) if early else None
        try:
            packed = [*(e.packed for e in early), *(r.packed for r in reads if r is not None)]
            if packed:
                conn.send_packed_command([b"".join(packed)])
                yield
            counts = [*(e.replies for e in early), *(r.replies for r in reads if r is not None)]
            got = iter(_split(read_replies(conn, sum(counts)), counts))  # read at once
            for e in early:
                watched.checks[e.partition] = (e, next(got))
            replies = [next(got) if read else None for read in reads]
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            pool.release(conn)
            raise
        if watched is None:
            pool.release(conn)
        flats: list[list | bool | None] = []  # False: the read failed
        for request, reply in zip(requests, replies, strict=True):
            try:
                flat = self.states.flat(request.partition, reply) if reply is not None else None
                flats.append(flat)
            except (redis.ResponseError, PartitionDataError):
                flats.append(False)
        joined = None
        if not any(flat is False for flat in flats):
            joined = self.states.complete_all(requests, flats, shape, space, shadow)
        if joined is not None:
            return list(joined[1]), joined[0], watched
        return [None if flat is False else self.states.complete(request, flat, shape, space, shadow)
                for request, flat in zip(requests, flats, strict=True)], None, watched  # fmt: skip

    def commit(
        self, client: redis.Redis, commits: list[tuple[Commit, PreparedCommit | None]],
        whole: bool = False, pack: Packing | None = None, watched: Watched | None = None,
    ) -> list[Outcome]:  # fmt: skip
        """Apply commits of distinct partitions of `client`'s node (see the module's
        docstring): for each, its result, its refusal, the error it met (an error reply
        with every reply read, or a connection error that leaves it unsettled: it may have
        applied), or WITHHELD (`whole`, one Redis: all or none go). `pack`, when given, packs
        the commits not packed yet at once, while Redis runs their checks. On `watched`
        (one Redis), the connection that holds their early checks."""
        if self.one_transaction:
            return self._in_one_transaction(client, commits, whole, pack, watched)
        return run_steps(self.commit_steps(client, commits, pack))

    def commit_steps(
        self, client: redis.Redis, commits: list[tuple[Commit, PreparedCommit | None]],
        pack: Packing | None = None,
    ) -> Steps:  # fmt: skip
        """`commit` on a cluster node, as steps: it yields once the checks are sent (after
        packing the writes) and once the transactions are, before it waits for their replies
        (other nodes' go meanwhile: flow.together_on_nodes)."""
        pool = client.connection_pool
        outcomes: list = [None] * len(commits)
        conns: list[redis.connection.Connection] = []
        checks = [self.committer.checks(c) for c, _ in commits]
        try:
            conns = [pool.get_connection() for _ in commits]
            for i, (packed, _) in enumerate(checks):
                _step(outcomes, conns, i, conns[i].send_packed_command, [packed])
            # packed while Redis runs the checks, rather than between their replies
            commits = self._packed(commits, pack)
            yield
            for i, ((c, prepared), (_, n)) in enumerate(zip(commits, checks, strict=True)):
                _step(outcomes, conns, i, self._judged, conns[i], c, prepared, n)
            yield
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

    def _in_one_transaction(
        self, client: redis.Redis, commits: list[tuple[Commit, PreparedCommit | None]],
        whole: bool = False, pack: Packing | None = None, watched: Watched | None = None,
    ) -> list[Outcome]:  # fmt: skip
        """On one Redis: every commit's WATCH and checks on one connection in one send (or
        those sent early, with the states' reads, on `watched`'s), then one transaction of
        the writes of those whose checks passed (MULTI, each one's writes, EXEC), each
        settled from its own replies. Still all or nothing per commit (and for them all); a
        refused commit is left out (`whole`: the others are WITHHELD, none goes); a watched
        key changed before EXEC refuses them all (`conflict`: each computed and sent again);
        a lost connection leaves them all unsettled."""
        outcomes: list = [None] * len(commits)
        pool = client.connection_pool
        conn = watched.conn if watched is not None else pool.get_connection()
        try:
            early = self._early_replies(watched, [c for c, _ in commits])
            if early is None:
                checks = [self.committer.checks(c) for c, _ in commits]
                # an UNWATCH first on a connection that holds early checks not theirs
                unwatch = UNWATCH if watched is not None else b""
                conn.send_packed_command([unwatch + b"".join(packed for packed, _ in checks)])
                commits = self._packed(commits, pack)  # while Redis runs the checks
                if unwatch:
                    conn.read_response()
                early = [read_replies(conn, n) for _, n in checks]
            else:
                commits = self._packed(commits, pack)
            verdicts = [self.committer.verdict(c, replies) for (c, _), replies
                        in zip(commits, early, strict=True)]  # fmt: skip
            going = [i for i, v in enumerate(verdicts) if v.result is None]
            for i, verdict in enumerate(verdicts):
                outcomes[i] = verdict.result
            if whole and len(going) < len(commits):
                # a resend found applied is withheld too: settled alone, by its own commit
                outcomes = [WITHHELD if v.result is None or isinstance(v.result, CommitResult)
                            else v.result for v in verdicts]  # fmt: skip
                going = []
            if not going:
                conn.send_packed_command([UNWATCH])
                conn.read_response()
                return outcomes
            writes = [self.committer.writes(commits[i][0], commits[i][1], verdicts[i].seed,
                                            verdicts[i].entries) for i in going]  # fmt: skip
            conn.send_packed_command(
                chunks([MULTI, *(x for chunk, _ in writes for x in chunk), EXEC])
            )
            for i in going:  # a group's shares sliced while Redis runs EXEC, for the settling
                complete(commits[i][0])
            replies = read_replies(conn, 2 + sum(n for _, n in writes))
            at = 1
            for i, (_, n) in zip(going, writes, strict=True):
                outcomes[i] = self._settled(conn, commits[i], replies, at, n)
                at += n
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            conn.disconnect()
            return [exc if o is None else o for o in outcomes]  # unsettled: may have applied
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            raise
        finally:
            pool.release(conn)
        return outcomes

    def _early_replies(self, watched: Watched | None, commits: list[Commit]) -> list | None:
        """The replies of the commits' checks sent early on `watched`, each commit's; None
        unless every one of them is its own and no other batch's WATCH is held with them
        (the checks are then sent again, behind an UNWATCH)."""
        if watched is None or len(watched.checks) != len(commits):
            return None
        replies = [self.early.replies(watched, c) for c in commits]
        return None if any(r is None for r in replies) else replies

    def _packed(
        self, commits: list[tuple[Commit, PreparedCommit | None]], pack: Packing | None
    ) -> list[tuple[Commit, PreparedCommit]]:  # fmt: skip
        """Each commit with its writes packed: by `pack` at once where it can, else alone."""
        together = (pack() if pack is not None else None) or [None] * len(commits)
        return [(c, prepared or at_once or self.committer.prepare(c))
                for (c, prepared), at_once in zip(commits, together, strict=True)]  # fmt: skip

    def _settled(
        self, conn: redis.connection.Connection, commit: tuple[Commit, PreparedCommit],
        replies: list, at: int, n: int,
    ) -> Outcome:  # fmt: skip
        """One commit's outcome from the shared transaction's replies: MULTI's, its `n`
        QUEUED from `at`, and its part of EXEC's (EXEC's nil or error as it is)."""
        done = replies[-1]
        mine = done[at - 1 : at - 1 + n] if isinstance(done, list) else done
        try:
            return self.committer.settled(conn, *commit, [replies[0], *replies[at : at + n], mine])
        except redis.ResponseError as exc:
            return exc

    def _judged(
        self, conn: redis.connection.Connection, c: Commit, prepared: PreparedCommit | None,
        n: int,
    ) -> Sent | CommitResult | CommitRefusedError:  # fmt: skip
        """The checks' replies read and judged: the transaction sent, or the verdict."""
        return self.committer.send_writes(conn, c, prepared, read_replies(conn, n))


# A node's exchange as a generator: it yields where it has sent and would wait for replies,
# and returns its result (StopIteration's value)
Steps = Generator[None, None, Any]


def run_steps(steps: Steps) -> Any:
    """The result of steps run through, with nothing else between them."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _split(replies: list, counts: list[int]) -> list[list]:
    """`replies` cut into consecutive runs of these lengths."""
    ends = list(accumulate(counts))
    return [replies[end - n : end] for n, end in zip(counts, ends, strict=True)]


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
