"""The intent rules in Redis: the hash `{prefix}:rules` (rule name -> the rule's JSON, and
`:version`) and the announcements on `{prefix}:rules:updates` (worker/rules/definition.py holds
the rules themselves).

Every change is one MULTI/EXEC on the one key, the write and `HINCRBY :version 1` together,
so a reader sees each version with its rules; then the new version is PUBLISHed. The checks
before it (the key is a hash or absent, `:version` an integer, the rule count) run under
WATCH, so a change that lands in between makes the transaction run again, never lets it
write past them. One key means one slot: the same on a Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import redis

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.rules.definition import (
    MAX_RULES,
    VERSION_FIELD,
    Rule,
    RuleError,
    RuleSet,
    parse_version,
    rule_from_json,
    rule_to_json,
    ruleset_from_hash,
)

T = TypeVar("T")

# WATCH retries before giving up: each one means another change landed meanwhile.
_ATTEMPTS = 20


class NoSuchRuleError(RuleError):
    """The rules hash holds no rule of that name."""


def _kind(client: Client, key: str) -> str:
    kind = client.type(key)
    return kind.decode() if isinstance(kind, bytes) else str(kind)


def _wrong_type(key: str, kind: str) -> RuleError:
    return RuleError(f"key {key} holds a {kind}, not a hash of rules (WRONGTYPE): nothing written")


def _read(client: Client, key: str, command: Callable[[], T]) -> T:
    """command(), with a key of the wrong type named in a RuleError."""
    try:
        return command()
    except redis.ResponseError as exc:
        if not str(exc).startswith("WRONGTYPE"):
            raise
        try:
            kind = _kind(client, key)
        except redis.RedisError:
            kind = "another type"
        raise RuleError(f"key {key} holds a {kind}, not a hash of rules (WRONGTYPE)") from None


def read_rules(client: Client, keys: Keys) -> RuleSet:
    """Every rule and the version they belong to (one HGETALL); RuleError names a bad rule."""
    return ruleset_from_hash(_read(client, keys.rules, lambda: client.hgetall(keys.rules)))


def rules_version(client: Client, keys: Keys) -> int:
    """The rules' version (HGET `:version`; 0 when absent): what a worker polls."""
    raw = _read(client, keys.rules, lambda: client.hget(keys.rules, VERSION_FIELD))
    return parse_version(raw)


def read_rule(client: Client, keys: Keys, name: str) -> Rule:
    """One rule (HGET), whatever the others hold; NoSuchRuleError when there is none."""
    if name == VERSION_FIELD:
        raise NoSuchRuleError(f"no rule {name!r}: {VERSION_FIELD} is the rules' version")
    raw = _read(client, keys.rules, lambda: client.hget(keys.rules, name))
    if raw is None:
        raise NoSuchRuleError(f"no rule {name!r} under prefix {keys.prefix!r}")
    return rule_from_json(raw, name)


def set_rule(client: Client, keys: Keys, rule: Rule) -> int:
    """Add or replace a rule; return the new version."""

    def check(pipe) -> None:
        if not pipe.hexists(keys.rules, rule.name) and _count(pipe, keys) >= MAX_RULES:
            raise RuleError(
                f"rule {rule.name!r}: the rules hash holds {MAX_RULES} rules already, the "
                "most there may be (delete one first): nothing written"
            )

    return _change(
        client, keys, check, lambda pipe: pipe.hset(keys.rules, rule.name, rule_to_json(rule))
    )


def delete_rule(client: Client, keys: Keys, name: str) -> int:
    """Remove a rule (any field but `:version`, so a hand-written bad one too); return the
    new version. NoSuchRuleError when there is none: nothing written, no version used."""

    def check(pipe) -> None:
        if name == VERSION_FIELD or not pipe.hexists(keys.rules, name):
            raise NoSuchRuleError(f"no rule {name!r} under prefix {keys.prefix!r}: nothing deleted")

    return _change(client, keys, check, lambda pipe: pipe.hdel(keys.rules, name))


def _count(pipe, keys: Keys) -> int:
    """The rules in the hash (its fields but `:version`)."""
    return pipe.hlen(keys.rules) - int(pipe.hexists(keys.rules, VERSION_FIELD))


def _change(client: Client, keys: Keys, check: Callable, write: Callable) -> int:
    """Under WATCH: check the key's type and version, then check(pipe); then MULTI:
    write(pipe) and the version's HINCRBY; then PUBLISH the new version."""
    key = keys.rules
    for _ in range(_ATTEMPTS):
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                kind = _kind(pipe, key)
                if kind not in ("hash", "none"):
                    raise _wrong_type(key, kind)
                parse_version(pipe.hget(key, VERSION_FIELD))  # HINCRBY would refuse it later
                check(pipe)
                pipe.multi()
                write(pipe)
                pipe.hincrby(key, VERSION_FIELD, 1)
                version = int(pipe.execute()[-1])
            except redis.WatchError:
                continue
        client.publish(keys.rules_updates, str(version))
        return version
    raise RuleError(
        f"the rules under prefix {keys.prefix!r} changed {_ATTEMPTS} times while this change "
        "waited: nothing written, try again"
    )
