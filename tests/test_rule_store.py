"""The intent rules in a real Redis: each change one transaction with its version bump, the
version announced, a key of another type refused with nothing written, a Redis Cluster."""

from __future__ import annotations

import pytest

from worker.common.connection import connect
from worker.common.keys import Keys
from worker.rules import store as rule_store
from worker.rules.definition import MAX_RULES, RuleError, RuleSet, make_rule, rule_to_json
from worker.rules.store import (
    NoSuchRuleError,
    delete_rule,
    read_rule,
    read_rules,
    rules_version,
    set_rule,
)

pytestmark = pytest.mark.integration

KEYS = Keys("shop")


def subscribed(client):
    """A pub/sub on the rules' channel, its subscription confirmed."""
    sub = client.pubsub()
    sub.subscribe(KEYS.rules_updates)
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    return sub


def announced(sub) -> list[bytes]:
    """The versions announced so far."""
    found = []
    while (msg := sub.get_message(timeout=0.2)) is not None:
        found.append(msg["data"])
    return found


def test_each_change_bumps_the_version_and_announces_it(redis_server):
    r = connect(redis_server.url)
    sub = subscribed(r)
    assert read_rules(r, KEYS) == RuleSet() and rules_version(r, KEYS) == 0
    a = make_rule(name="a", above=0.7, rearm_below=0.5, cooldown_ms=900_000)
    b = make_rule(name="b", above=0.9, types=("checkout",))
    assert set_rule(r, KEYS, b) == 1
    assert set_rule(r, KEYS, a) == 2
    assert read_rules(r, KEYS) == RuleSet(version=2, rules=(a, b))
    a2 = make_rule(name="a", above=0.8)
    assert set_rule(r, KEYS, a2) == 3  # a replacement is a change too
    assert read_rule(r, KEYS, "a") == a2
    assert delete_rule(r, KEYS, "b") == 4
    assert read_rules(r, KEYS) == RuleSet(version=4, rules=(a2,))
    assert rules_version(r, KEYS) == 4
    assert r.hgetall(KEYS.rules) == {b"a": rule_to_json(a2), b":version": b"4"}
    assert announced(sub) == [b"1", b"2", b"3", b"4"]


def test_a_missing_rule_is_refused_and_uses_no_version(redis_server):
    r = connect(redis_server.url)
    set_rule(r, KEYS, make_rule(name="a", above=0.5))
    sub = subscribed(r)
    with pytest.raises(NoSuchRuleError, match="no rule 'z' under prefix 'shop': nothing deleted"):
        delete_rule(r, KEYS, "z")
    with pytest.raises(NoSuchRuleError, match="no rule ':version'"):
        delete_rule(r, KEYS, ":version")
    with pytest.raises(NoSuchRuleError, match="no rule 'z'"):
        read_rule(r, KEYS, "z")
    with pytest.raises(NoSuchRuleError, match="is the rules' version"):
        read_rule(r, KEYS, ":version")
    assert rules_version(r, KEYS) == 1 and announced(sub) == []


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda r: r.set(KEYS.rules, "coupon above 0.7"), "string"),
        (lambda r: r.rpush(KEYS.rules, "x"), "list"),
        (lambda r: r.xadd(KEYS.rules, {"a": "1"}), "stream"),
    ],
)
def test_a_key_of_another_type_is_refused_and_nothing_written(redis_server, make, kind):
    r = connect(redis_server.url)
    make(r)
    before = r.dump(KEYS.rules)
    sub = subscribed(r)
    rule = make_rule(name="a", above=0.5)
    for change in (lambda: set_rule(r, KEYS, rule), lambda: delete_rule(r, KEYS, "a")):
        with pytest.raises(RuleError, match=f"key shop:rules holds a {kind}, not a hash") as info:
            change()
        assert "nothing written" in str(info.value)
    for read in (read_rules, rules_version, lambda r, k: read_rule(r, k, "a")):
        with pytest.raises(RuleError, match=f"holds a {kind}, not a hash of rules"):
            read(r, KEYS)
    assert r.dump(KEYS.rules) == before and announced(sub) == []


def test_a_version_that_is_not_an_integer_stops_changes_and_reads(redis_server):
    r = connect(redis_server.url)
    r.hset(KEYS.rules, ":version", "three")
    with pytest.raises(RuleError, match="holds b'three', not an integer"):
        set_rule(r, KEYS, make_rule(name="a", above=0.5))
    with pytest.raises(RuleError, match="not an integer"):
        rules_version(r, KEYS)
    assert r.hgetall(KEYS.rules) == {b":version": b"three"}


def test_a_bad_rule_written_by_hand_is_named_and_can_be_deleted(redis_server):
    r = connect(redis_server.url)
    good = make_rule(name="good", above=0.5)
    set_rule(r, KEYS, good)
    r.hset(KEYS.rules, "bad rule", b'{"above":2')
    with pytest.raises(RuleError, match="rule 'bad rule': not valid JSON"):
        read_rules(r, KEYS)
    assert read_rule(r, KEYS, "good") == good  # one rule reads whatever the others hold
    assert delete_rule(r, KEYS, "bad rule") == 2
    assert read_rules(r, KEYS) == RuleSet(version=2, rules=(good,))


def test_at_most_64_rules(redis_server):
    r = connect(redis_server.url)
    for i in range(MAX_RULES):
        set_rule(r, KEYS, make_rule(name=f"r{i:02}", above=0.5))
    with pytest.raises(RuleError, match="holds 64 rules already"):
        set_rule(r, KEYS, make_rule(name="one-more", above=0.5))
    assert set_rule(r, KEYS, make_rule(name="r00", above=0.6)) == MAX_RULES + 1  # replacing
    assert len(read_rules(r, KEYS).rules) == MAX_RULES


def test_a_change_landing_meanwhile_makes_the_transaction_run_again(redis_server, monkeypatch):
    r = connect(redis_server.url)
    other = connect(redis_server.url)
    real_kind, calls = rule_store._kind, []

    def kind_then_a_concurrent_change(client, key):
        calls.append(key)
        if len(calls) == 1:  # another operator's change, between the WATCH and the EXEC
            other.hset(key, "theirs", rule_to_json(make_rule(name="theirs", above=0.1)))
            other.hincrby(key, ":version", 1)
        return real_kind(client, key)

    monkeypatch.setattr(rule_store, "_kind", kind_then_a_concurrent_change)
    assert set_rule(r, KEYS, make_rule(name="mine", above=0.5)) == 2
    assert len(calls) == 2
    assert [x.name for x in read_rules(r, KEYS).rules] == ["mine", "theirs"]


def test_on_a_redis_cluster(cluster_url):
    r = connect(cluster_url, cluster=True)
    sub = subscribed(r)
    assert set_rule(r, KEYS, make_rule(name="a", above=0.5)) == 1
    assert set_rule(r, KEYS, make_rule(name="b", above=0.6)) == 2
    assert delete_rule(r, KEYS, "a") == 3
    assert [x.name for x in read_rules(r, KEYS).rules] == ["b"]
    assert rules_version(r, KEYS) == 3
    assert announced(sub) == [b"1", b"2", b"3"]
    r.set("other:rules", "x")
    with pytest.raises(RuleError, match="holds a string"):
        set_rule(r, Keys("other"), make_rule(name="a", above=0.5))
