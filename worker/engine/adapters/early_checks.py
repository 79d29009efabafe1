"""A cold batch's commit checks sent with its states' read: the WATCH and the checks go in
front of the read, on one connection, and the commit follows on it once the batch is built.
Two round trips where there were three (the read, the checks, the transaction).

A batch computed cold (nothing read ahead for it: at low traffic, every batch) read its
states, was built, then sent its commit's WATCH and checks, then its transaction. All the
checks read is known before the batch is built but two things:

- the sequence the states are read at: read in the same send, behind the WATCH;
- the streams its commit writes (WATCHed, their types checked): taken to be the ones the
  partition's last commit wrote (its scores' and dead letters' before any).

The guarantee is the one of adapters/commit.py: the WATCH comes first, so EXEC applies only
if nothing watched changed since the states were read; what the checks read unwatched (the
position, the last commit token, the count) changes only with the watched sequence.

They read the server's time too, which only a partition's first commit uses (its sequence
starts from the clock). When the built commit is not the one the checks were made for (it
writes other streams, say actions a rule fired), its checks are sent again behind an
UNWATCH, on the same connection, as if none had gone early.
Only on one Redis: on a cluster a partition's commits go to its node by the slot map, which
a resharding may change between the read and the commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from worker.common.connection import read_replies
from worker.engine.adapters.commit import Committer
from worker.engine.adapters.states import StateReader
from worker.engine.adapters.streams import Cursor
from worker.engine.compute.batch import Batch
from worker.engine.compute.pipeline import Commit
from worker.engine.compute.user_states import UserStates


@dataclass(frozen=True)
class Early:
    """One batch's checks made before its commit was built, and what they were made for."""

    partition: int
    packed: bytes
    replies: int
    streams: tuple[str, ...]
    after: bytes
    first: bytes


@dataclass
class Watched:
    """A pooled connection of `client` that holds the WATCH of batches' commits, sent with
    their states' read, and each one's checks with their replies, by partition. Released
    by whoever sends on it last (after EXEC or UNWATCH), dropped on a failure."""

    client: redis.Redis
    conn: redis.connection.Connection
    checks: dict[int, tuple[Early, list]] = field(default_factory=dict)
    # the reads of new entries sent behind the states' (the cursors each read) and replies
    groups: list[list[Cursor]] = field(default_factory=list)
    reads: list = field(default_factory=list)

    def release(self) -> None:
        """Back to the pool (its WATCH ended by EXEC or UNWATCH)."""
        self.client.connection_pool.release(self.conn)

    def drop(self) -> None:
        """Disconnected (which ends its WATCH) and back to the pool: after a failure, when
        a reply may still be in flight."""
        self.conn.disconnect()
        self.release()


class EarlyChecks:
    """Makes a worker's checks of batches' commits before they are built, and says when a
    built commit is the one they were made for."""

    def __init__(self, committer: Committer) -> None:
        self.committer = committer
        self._streams: dict[int, tuple[str, ...]] = {}  # the partition's last commit's

    def of(self, batch: Batch) -> Early:
        """The checks of the batch's commit, as if it writes the streams the partition's last
        commit wrote."""
        p, keys = batch.partition, self.committer.keys
        # before any: the scores' and the dead letters' (every commit has its dead letters
        # part, empty or not, which watches their stream)
        streams = self._streams.get(p) or (keys.scores(p), keys.deadletter(p))
        first = batch.ids[0]
        # the server's time read last, as for a partition's first commit: whether this one
        # is shows only once the states are read
        packed, n = self.committer.checks_of(p, streams, batch.after, first, clock=True)
        return Early(p, packed, n, streams, batch.after, first)

    def replies(self, watched: Watched, commit: Commit) -> list | None:
        """The replies of the checks sent early for `commit`, when they are its checks; else
        None (they are sent again). Either way the partition's next early checks are made
        for the streams this commit writes."""
        streams = tuple(self.committer.streams(commit))
        self._streams[commit.partition] = streams
        early, replies = watched.checks.get(commit.partition, (None, []))
        if early is None or not commit.ack_ids:
            return None
        if (streams, commit.after, commit.ack_ids[0]) != (early.streams, early.after, early.first):
            return None
        return replies if commit.seq == b"" else replies[:-1]  # the time: for a first one


def read_watched(
    states: StateReader, early: EarlyChecks, client: redis.Redis, batch: Batch,
    users: list[str], spec: tuple, reads: tuple[list[list[Cursor]], bytes] = ([], b""),
) -> tuple[UserStates, Watched | None]:  # fmt: skip
    """The batch's users' states (as StateReader.read, for the models' `spec`) read behind
    its commit's early checks, and the connection that holds their WATCH, with the replies
    of `reads` (reads of new entries, by the cursors each reads, and packed), sent behind
    the states' read. None, and nothing sent, when every state is known: the commit then
    goes the usual way, its checks with the reads ahead, in as many round trips."""
    shape, space, shadow = spec
    p = batch.partition
    request = states.request(p, users)
    read = states.command(request)
    if read is None:  # every state known: nothing to read, so no sequence to disagree with
        return states.complete(request, None, shape, space, shadow), None
    groups, packed = reads
    watched = Watched(client, client.connection_pool.get_connection(), groups=groups)
    try:
        while True:
            check = early.of(batch)
            watched.conn.send_packed_command([check.packed + read.packed + packed])
            replies = read_replies(watched.conn, check.replies + read.replies + len(groups))
            if groups:
                watched.reads = replies[check.replies + read.replies :]
            flat = states.flat(p, replies[check.replies : check.replies + read.replies])
            got = states.complete(request, flat, shape, space, shadow)
            if got is not None:
                watched.checks[p] = (check, replies[: check.replies])
                return got, watched
            # another commit landed since ours: nothing cached for this partition holds
            states.cache.drop(p)
            request = states.request(p, users)
            read = states.command(request)
            groups, packed = [], b""  # they were read: what they brought is in watched.reads
    except BaseException:
        watched.drop()
        raise
