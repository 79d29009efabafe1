"""The intent rules a worker follows: the rule set in Redis (`{prefix}:rules`), re-read when a
change is announced on `{prefix}:rules:updates` and, since pub/sub drops messages while
disconnected, whenever its version moved at a poll (docs/contract.md, Acting on intent).

A rule set that does not validate is refused whole, once per version, and the running set
stays; so does a Redis outage (the next poll retries).
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from worker.common.announcements import start_listener
from worker.common.connection import refresh_topology
from worker.common.keys import Keys
from worker.rules.definition import RuleError
from worker.rules.step import RuleTable
from worker.rules.store import read_rules, rules_version

log = logging.getLogger("intentstream.worker")

NO_RULES = RuleTable.of([], 0)


class RulesRejectedError(Exception):
    """The rule set in Redis does not validate; the running set stays."""


class RuleSource:
    """Follows the rule set in Redis; `poll()` hands over a changed, valid set."""

    def __init__(self, client: redis.Redis, keys: Keys, poll_seconds: float = 2.0) -> None:
        self.r = client
        self.keys = keys
        self.poll_seconds = poll_seconds
        self.current = NO_RULES
        self._seen: int | str | None = None  # the version last looked at (or its error)
        self._next_check = 0.0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._trouble = False
        self._listener = start_listener(client, keys.rules_updates, self._wake, self._closed,
                                        "rules-updates")  # fmt: skip

    def poll(self) -> RuleTable | None:
        """The new rule set if its version moved and it validated, else None. Cheap between
        checks: one HGET every `poll_seconds`, or at an announcement.

        Raises RulesRejectedError once per refused version."""
        now = time.monotonic()
        if now < self._next_check and not self._wake.is_set():
            return None
        self._wake.clear()
        self._next_check = now + self.poll_seconds
        try:
            return self._check()
        except redis.RedisError as exc:  # an outage: the next poll retries
            if not self._trouble:
                log.warning("cannot check the intent rules: %s", exc, extra={"error": str(exc)})
            self._trouble = True
            refresh_topology(self.r)
            return None

    def _check(self) -> RuleTable | None:
        try:
            version: int | str = rules_version(self.r, self.keys)
        except RuleError as exc:
            version = f"error: {exc}"
        self._trouble = False
        if version == self._seen or version == self.current.version:
            self._seen = version
            return None
        self._seen = version
        if isinstance(version, str):
            raise RulesRejectedError(version[len("error: ") :])
        try:
            ruleset = read_rules(self.r, self.keys)
        except RuleError as exc:
            raise RulesRejectedError(str(exc)) from None
        self.current = RuleTable.of(ruleset.rules, ruleset.version)
        return self.current

    def close(self) -> None:
        self._closed.set()
