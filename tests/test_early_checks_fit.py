"""Early checks (engine/adapters/early_checks.py) without Redis: the checks made before a
batch is built are the ones `Committer.checks` makes for its commit (same bytes, the
server's time read last), and their replies are used only for the commit they were made
for: the same partition, entries and streams; the time's reply kept for a partition's first
commit alone."""

from __future__ import annotations

from types import SimpleNamespace

from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.early_checks import EarlyChecks, Watched
from worker.engine.compute.batch import Batch
from worker.engine.compute.parts.actions import Actions

KEYS = Keys()


def committer() -> Committer:
    limits = CommitLimits(1000, 1000, 1024, 0)
    return Committer(SimpleNamespace(), KEYS, "c1:abc", limits, nodes=SimpleNamespace())


def batch(p: int = 3) -> Batch:
    return Batch(p, ids=[b"5-0", b"6-0"], after=b"4-0")


def commit_of(b: Batch, seq: bytes = b"17", parts: list | None = None) -> SimpleNamespace:
    """What the checks read of a Commit: its partition, entries, sequence and parts."""
    dead = SimpleNamespace(watched=lambda keys, p: [keys.deadletter(p)])
    return SimpleNamespace(partition=b.partition, ack_ids=list(b.ids), after=b.after, seq=seq,
                           parts=[dead] if parts is None else parts)  # fmt: skip


def test_the_early_checks_are_the_commits_own_with_the_time_read_last():
    c, b = committer(), batch()
    early = EarlyChecks(c).of(b)
    checks, n = c.checks(commit_of(b, seq=b""))  # a first commit reads the time
    assert (early.packed, early.replies) == (checks, n)
    assert early.streams == (KEYS.scores(3), KEYS.deadletter(3))


def test_their_replies_serve_only_the_commit_they_were_made_for():
    c, b = committer(), batch()
    checks = EarlyChecks(c)
    early = checks.of(b)
    replies = [f"r{i}" for i in range(early.replies)]
    watched = Watched(SimpleNamespace(), SimpleNamespace(), {3: (early, replies)})
    assert checks.replies(watched, commit_of(b)) == replies[:-1]  # the time left out
    assert checks.replies(watched, commit_of(b, seq=b"")) == replies  # a first commit's
    moved = commit_of(b)
    moved.after = b"3-0"
    assert checks.replies(watched, moved) is None
    other = commit_of(batch(4))
    assert checks.replies(watched, other) is None  # no checks of its partition went
    firing = SimpleNamespace(watched=lambda keys, p: [keys.actions(p)])
    assert checks.replies(watched, commit_of(b, parts=[*commit_of(b).parts, firing])) is None


def test_the_next_checks_are_made_for_the_streams_the_last_commit_wrote():
    c, b = committer(), batch()
    checks = EarlyChecks(c)
    firing = commit_of(b)
    firing.parts.append(Actions("m1", [], [object()]))  # a rule fired: it writes actions
    watched = Watched(SimpleNamespace(), SimpleNamespace(), {})
    assert checks.replies(watched, firing) is None
    assert checks.of(b).streams == (KEYS.scores(3), KEYS.deadletter(3), KEYS.actions(3))
