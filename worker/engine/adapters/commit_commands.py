"""A partition's commands that its every commit sends as they are (adapters/commit.py),
packed once a partition, not once a commit: at low traffic a round packs a commit for each
partition it touched."""

from __future__ import annotations

from dataclasses import dataclass

from worker.common.keys import Keys
from worker.engine.adapters.resp import bulk, command_head, packed, resp_args


@dataclass(frozen=True)
class PartitionCommands:
    """A partition's commands that every commit writing these streams sends as they are."""

    checks_head: bytes  # WATCH, GET the lease, GET the position
    # the XRANGE of the entries between a batch's position and its first, but for the two
    # ids: a commit's only check that is not the same at every commit (framed in `between`)
    xrange_head: bytes
    checks_tail: bytes  # GET the sequence, TYPE each stream, GET the token, GET the count
    checks: int  # the checks' replies, the XRANGE between head and tail included
    # each stream is trimmed once a commit, not at every XADD (whose MAXLEN option costs about
    # a quarter of the XADD): the same bound, seen from outside the transaction
    trim_scores: bytes
    get_last_commit: bytes
    incr_seq: bytes
    # a SET of the position, the last commit token and the count, but for its value (`bulk`):
    # a partition's every commit sets the same three keys, so only the value is framed
    set_acked: bytes
    set_last_commit: bytes
    set_committed: bytes

    @classmethod
    def of(cls, k: Keys, p: int, streams: tuple[str, ...], scores_maxlen: int) -> PartitionCommands:
        """Partition p's, for commits writing `streams`, its scores trimmed to about
        `scores_maxlen` entries."""
        head = [("WATCH", k.lease(p), k.commit_seq(p), *streams), ("GET", k.lease(p)),
                ("GET", k.acked(p))]  # fmt: skip
        tail = [("GET", k.commit_seq(p)), *(("TYPE", key) for key in streams),
                ("GET", k.last_commit(p)), ("GET", k.committed(p))]  # fmt: skip
        return cls(
            b"".join(packed(*x) for x in head),
            command_head(6, "XRANGE", k.events(p)),
            b"".join(packed(*x) for x in tail),
            len(head) + 1 + len(tail),
            packed("XTRIM", k.scores(p), "MAXLEN", "~", scores_maxlen),
            packed("GET", k.last_commit(p)),
            packed("INCR", k.commit_seq(p)),
            command_head(3, "SET", k.acked(p)),
            command_head(3, "SET", k.last_commit(p)),
            command_head(3, "SET", k.committed(p)),
        )

    def between(self, after: bytes, first: bytes) -> bytes:
        """XRANGE events (after (first COUNT 1: is any entry between a batch's position and
        its first entry? (hiredis packing it took ~1.8 µs a commit, framing it ~0.3)."""
        return self.xrange_head + bulk(b"(" + after) + bulk(b"(" + first) + _COUNT_1


_COUNT_1 = resp_args(("COUNT", 1))
