"""The commit (checks under WATCH, then MULTI/EXEC) called directly against a real Redis: ok,
applied, every refusal, and a change between the checks and EXEC."""

from __future__ import annotations

import pytest
import redis

from model.scoring import ScoringModel
from tests.golden import GOLDEN_EVENTS, golden_model
from worker.common.connection import connect, read_replies
from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, CommitRefusedError, Committer
from worker.engine.compute.batch import DeadLetter, parse_batch
from worker.engine.compute.parts.dead_letters import MAX_DEAD_FIELDS, dead_letter_items
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.user_states import UserStates, distinct_users

pytestmark = pytest.mark.integration

GROUP, CONSUMER, HOLDER = "g", "c", "c:token"
KEYS = Keys("intentstream")
STREAM = KEYS.events(0)
LIMITS = CommitLimits(scores_maxlen=1000, deadletter_maxlen=1000, deadletter_max_value_bytes=64,
                      state_ttl_ms=0)  # fmt: skip


class Setup:
    """A partition whose entries CONSUMER reads (NOACK, as the worker does), its lease held by
    HOLDER; each batch read follows the one read before (`after`)."""

    def __init__(self, url: str) -> None:
        self.r = connect(url)
        self.r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        self.r.set(KEYS.lease(0), HOLDER)
        self.script = Committer(self.r, KEYS, HOLDER, LIMITS)
        self.model = ScoringModel(golden_model(), version="1")
        self.after = b"0-0"

    def read(self, *events: dict, consumer: str = CONSUMER):
        for fields in events:
            self.r.xadd(STREAM, fields)
        reply = self.r.xreadgroup(GROUP, consumer, {STREAM: ">"}, noack=True)
        entries = [[i, [x for kv in f.items() for x in kv]] for i, f in reply[0][1]]
        batch = parse_batch(0, entries)
        if consumer == CONSUMER:
            batch.after, self.after = self.after, batch.ids[-1]
        return batch

    def commit_of(self, batch, seq: bytes = b""):
        states = UserStates.empty(distinct_users(batch), self.model.state_shape, seq)
        return build_commit(batch, states, self.model)

    def position(self) -> bytes | None:
        """The partition's last commit's last entry."""
        return self.r.get(KEYS.acked(0))


@pytest.fixture
def setup(redis_server) -> Setup:
    return Setup(redis_server.url)


def alice(t: str) -> dict:
    return {"user_id": "alice", "type": t}


def test_ok_writes_everything_and_a_resend_reports_applied(setup):
    commit = setup.commit_of(setup.read(*(alice(t) for t in GOLDEN_EVENTS), {"type": "x"}))
    first = setup.script.run(commit)
    assert not first.resent and first.replaced == 0
    assert setup.r.xlen(KEYS.scores(0)) == 3 and setup.r.xlen(KEYS.deadletter(0)) == 1
    assert setup.position() == commit.ack_ids[-1]
    state = setup.r.hgetall(KEYS.state(0, "alice"))
    assert state[b"n"] == b"3" and state[b"model"] == b"1" and len(state[b"h"]) == 8
    again = setup.script.run(commit)  # as redis-py resends after a lost reply
    assert again.resent and again.seq == first.seq
    assert setup.r.xlen(KEYS.scores(0)) == 3


def test_a_commit_needs_no_script_in_redis(setup):
    setup.r.script_flush()  # as after a restart without persistence of scripts
    result = setup.script.run(setup.commit_of(setup.read(alice("view"))))
    assert not result.resent and setup.r.xlen(KEYS.scores(0)) == 1 and setup.position()


def checked(setup, commit) -> list:
    """The replies to the commit's WATCH and checks, sent on a connection of its own (kept
    in setup.conn for the writes)."""
    setup.conn = setup.r.connection_pool.get_connection()
    command, n = setup.script.checks(commit)
    setup.conn.send_packed_command([command])
    return read_replies(setup.conn, n)


def test_a_watched_key_changed_after_the_checks_applies_nothing(setup):
    commit = setup.commit_of(setup.read(alice("view")))
    replies = checked(setup, commit)
    setup.r.incr(KEYS.commit_seq(0))  # another commit landed between the checks and EXEC
    result = setup.script.finish(setup.conn, commit, None, replies)
    assert isinstance(result, CommitRefusedError) and result.reason == "conflict"
    assert setup.r.xlen(KEYS.scores(0)) == 0 and setup.position() is None
    assert setup.r.exists(KEYS.state(0, "alice")) == 0
    # the connection is clean: the commit, read at the new sequence and checked again on
    # it, applies
    commit.seq = setup.r.get(KEYS.commit_seq(0))
    assert not setup.script.finish(setup.conn, commit, None, checked(setup, commit)).resent
    assert setup.r.xlen(KEYS.scores(0)) == 1 and setup.position() == commit.ack_ids[-1]


def test_a_lease_taken_after_the_checks_applies_nothing(setup):
    commit = setup.commit_of(setup.read(alice("view")))
    replies = checked(setup, commit)
    setup.r.set(KEYS.lease(0), "another:process")
    result = setup.script.finish(setup.conn, commit, None, replies)
    assert isinstance(result, CommitRefusedError) and setup.position() is None
    assert setup.r.xlen(KEYS.scores(0)) == 0


def test_a_check_that_fails_on_data_raises_and_writes_nothing(setup):
    commit = setup.commit_of(setup.read(alice("view")))
    setup.r.delete(STREAM)
    setup.r.set(STREAM, "not a stream")  # the events key of another type: XRANGE fails
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        setup.script.run(commit)
    assert setup.r.xlen(KEYS.scores(0)) == 0 and setup.r.exists(KEYS.state(0, "alice")) == 0
    assert setup.r.get(KEYS.commit_seq(0)) is None


def test_a_user_that_may_not_watch_never_writes(setup):
    """An ACL user without WATCH (an old deployment's worker user): the writes would run
    unguarded, so none is sent."""
    setup.r.acl_setuser("nowatch", enabled=True, passwords=["+pw"], keys=["*"],
                        commands=["+@all", "-watch"])  # fmt: skip
    url = setup.r.connection_pool.connection_kwargs
    r = redis.Redis(host=url["host"], port=url["port"], username="nowatch", password="pw")
    script = Committer(r, KEYS, HOLDER, LIMITS)
    with pytest.raises(redis.ResponseError, match=r"NOPERM|permission"):
        script.run(setup.commit_of(setup.read(alice("view"))))
    assert setup.r.xlen(KEYS.scores(0)) == 0 and setup.position() is None


def test_a_commit_whose_connection_was_killed_applies_once(setup, redis_server):
    commit = setup.commit_of(setup.read(alice("view")))
    connect(redis_server.url).client_kill_filter(_type="normal")  # the worker's connections
    try:
        first = setup.script.run(commit)
    except redis.ConnectionError:
        first = setup.script.run(commit)  # sent again, as the worker does after an outage
    assert not first.resent and setup.r.xlen(KEYS.scores(0)) == 1


def test_not_owned(setup):
    commit = setup.commit_of(setup.read(alice("view")))
    setup.r.set(KEYS.lease(0), "another:process")
    with pytest.raises(CommitRefusedError, match="not_owned"):
        setup.script.run(commit)
    assert setup.r.xlen(KEYS.scores(0)) == 0 and setup.position() is None


def test_not_next_when_the_batch_does_not_follow_the_last_commit(setup):
    first, second = setup.read(alice("view")), setup.read(alice("coupon"))
    with pytest.raises(CommitRefusedError, match="not_next") as refused:
        setup.script.run(setup.commit_of(second))  # follows `first`, not committed
    assert refused.value.detail == "0-0"  # nothing committed yet
    assert setup.r.xlen(KEYS.scores(0)) == 0
    seq = setup.script.run(setup.commit_of(first)).seq
    setup.script.run(setup.commit_of(second, seq))  # in order, both apply
    assert setup.r.xlen(KEYS.scores(0)) == 2 and setup.position() == second.ids[-1]


def test_behind_when_the_group_was_moved_back_below_the_position(setup):
    """`XGROUP SETID ... 0` under a running worker: the entries delivered again follow the
    worker's last read, which is the position, yet lie below it: never applied again, and
    `acked` never written backwards."""
    first = setup.read(alice("view"), {"type": "dead"})
    setup.script.run(setup.commit_of(first))
    setup.r.xgroup_setid(STREAM, GROUP, "0")
    again = setup.read(alice("coupon"))  # the first two again, then the new one
    assert again.ids[:2] == first.ids and again.after == first.ids[-1]
    with pytest.raises(CommitRefusedError, match="behind") as refused:
        setup.script.run(setup.commit_of(again, setup.r.get(KEYS.commit_seq(0))))
    assert refused.value.detail == first.ids[-1].decode()
    assert setup.position() == first.ids[-1] and setup.r.xlen(KEYS.deadletter(0)) == 1


def test_a_deleted_acked_is_the_last_commit_tokens_entry(setup):
    """`DEL acked:{p}`: the position is the entry the last commit token records, so the
    next batch commits and one read again from the start does not."""
    first = setup.read(alice("view"), {"type": "dead"})
    seq = setup.script.run(setup.commit_of(first)).seq
    setup.r.delete(KEYS.acked(0))
    replay = setup.commit_of(parse_batch(0, [[first.ids[0], [b"type", b"dead"]]]), seq)
    with pytest.raises(CommitRefusedError, match="not_next"):  # follows 0-0: not the position
        setup.script.run(replay)
    second = setup.read(alice("coupon"))
    setup.script.run(setup.commit_of(second, seq))
    assert setup.position() == second.ids[-1] and setup.r.xlen(KEYS.deadletter(0)) == 1


@pytest.mark.parametrize("value", [b"garbage", b"1-2-3", b"-1-0"])
def test_an_unparsable_acked_is_a_bad_key(setup, value):
    setup.r.set(KEYS.acked(0), value)
    with pytest.raises(CommitRefusedError, match="bad_key"):
        setup.script.run(setup.commit_of(setup.read(alice("view"))))
    assert setup.position() == value and setup.r.xlen(KEYS.scores(0)) == 0


def test_gap_when_another_reader_took_entries_before_the_batch(setup):
    """A paused worker past its lease reads on: the entries it took lie between the last
    commit and this worker's batch, which must not commit over them."""
    taken = setup.read(alice("view"), consumer="paused-holder")  # read, never committed
    commit = setup.commit_of(setup.read(alice("add_to_cart")))
    with pytest.raises(CommitRefusedError, match="gap") as refused:
        setup.script.run(commit)
    assert refused.value.detail == taken.ids[0].decode()
    assert setup.r.xlen(KEYS.scores(0)) == 0 and setup.position() is None


def test_conflict_when_the_sequence_moved(setup):
    setup.script.run(setup.commit_of(setup.read(alice("view"))))
    stale = setup.commit_of(setup.read(alice("coupon")), seq=b"")  # read before that commit
    with pytest.raises(CommitRefusedError, match="conflict"):
        setup.script.run(stale)
    assert setup.r.xlen(KEYS.scores(0)) == 1


@pytest.mark.parametrize("key", [KEYS.scores(0), KEYS.deadletter(0), KEYS.commit_seq(0),
                                 KEYS.acked(0)])  # fmt: skip
def test_bad_key_when_a_partition_key_holds_another_type(setup, key):
    commit = setup.commit_of(setup.read(alice("view"), {"type": "dead"}))
    setup.r.delete(key)
    setup.r.lpush(key, "oops")
    with pytest.raises(CommitRefusedError, match="bad_key") as refused:
        setup.script.run(commit)
    assert refused.value.detail == key
    assert setup.r.exists(KEYS.state(0, "alice")) == 0
    assert setup.r.type(KEYS.acked(0)) == (b"list" if key == KEYS.acked(0) else b"none")


def test_a_state_key_of_another_type_is_replaced_and_the_rest_commits(setup):
    b, c = {"user_id": "b", "type": "view"}, {"user_id": "c", "type": "view"}
    batch = setup.read(alice("view"), b, c)
    commit = setup.commit_of(batch)
    setup.r.set(KEYS.state(0, "b"), "oops")  # an operator's SET
    result = setup.script.run(commit)
    assert result.replaced == 1
    for user in ("alice", "b", "c"):
        assert setup.r.hget(KEYS.state(0, user), "n") == b"1"
    assert setup.r.xlen(KEYS.scores(0)) == 3 and setup.position() == batch.ids[-1]


def test_dead_letters_are_cut_and_trimmed(setup):
    setup.script.limits = CommitLimits(1000, 5, 64, 0)
    huge = {"user_id": "x" * 1000, "type": "view", "blob": "y" * 5000}
    seq = b""
    for _ in range(4):
        seq = setup.script.run(setup.commit_of(setup.read(*([huge] * 50)), seq)).seq
    dead = setup.r.xrange(KEYS.deadletter(0))
    assert len(dead) < 200  # trimmed approximately to about 5
    fields = dead[-1][1]
    assert fields[b"blob"] == b"y" * 64 and fields[b"blob:bytes"] == b"5000"
    assert fields[b"user_id"] == b"x" * 64 and fields[b"user_id:bytes"] == b"1000"
    assert b"must be 1-256 bytes" in fields[b"error"]


def test_dead_letter_items_keep_a_bounded_number_of_fields():
    many = [x for i in range(100) for x in (f"f{i}".encode(), b"v")]
    items = dead_letter_items(DeadLetter(b"1-0", "bad", many), 64)
    assert items[0] == str(MAX_DEAD_FIELDS).encode()
    assert f"only the first {MAX_DEAD_FIELDS} of 100 fields kept".encode() in items[2]
