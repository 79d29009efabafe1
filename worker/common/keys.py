"""Every Redis key name intentstream uses (docs/contract.md: Events in, User state and scores
out, Model artifacts and the registry, intent rules), built in this one module.

Every key of partition p carries the hash tag `{p}`, so a partition's stream, states, scores,
dead letters and coordination keys live in one Redis Cluster slot and one Lua script may
touch them all.
"""

from __future__ import annotations

import re
import zlib


def partition_of(user_id: str, partitions: int) -> int:
    """The partition of a user: crc32 of the UTF-8 user id, mod the number of partitions."""
    return zlib.crc32(user_id.encode("utf-8")) % partitions


def parse_state_key(keys: Keys, key: bytes) -> tuple[int, bytes] | None:
    """(partition, user id bytes) of a state key (`Keys.state`), or None for a key of
    another shape."""
    head = f"{keys.prefix}:state:{{".encode()
    if not key.startswith(head):
        return None
    digits, sep, user = key[len(head) :].partition(b"}:")
    if not sep or not digits.isdigit() or not user:
        return None
    return int(digits), user


class Keys:
    """Key names under one prefix."""

    def __init__(self, prefix: str = "intentstream") -> None:
        self.prefix = prefix

    # ---- one partition's keys ------------------------------------------------------------

    def events(self, p: int) -> str:
        return f"{self.prefix}:events:{{{p}}}"

    def scores(self, p: int) -> str:
        return f"{self.prefix}:scores:{{{p}}}"

    def deadletter(self, p: int) -> str:
        return f"{self.prefix}:deadletter:{{{p}}}"

    def actions(self, p: int) -> str:
        """The actions the intent rules fired for partition p's users."""
        return f"{self.prefix}:actions:{{{p}}}"

    def state(self, p: int, user_id: str) -> str:
        return f"{self.prefix}:state:{{{p}}}:{user_id}"

    def state_prefix(self, p: int) -> str:
        return f"{self.prefix}:state:{{{p}}}:"

    def state_match(self, p: int | None = None) -> str:
        """The SCAN MATCH pattern of partition p's states, or of every partition's (None);
        glob characters of the prefix are escaped."""
        prefix = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix)
        return f"{prefix}:state:*" if p is None else f"{prefix}:state:{{{p}}}:*"

    def lease(self, p: int) -> str:
        return f"{self.prefix}:lease:{{{p}}}"

    def acked(self, p: int) -> str:
        """The id of the last entry acknowledged (where a deleted group is recreated)."""
        return f"{self.prefix}:acked:{{{p}}}"

    def committed(self, p: int) -> str:
        """How many entries the partition's commits have covered, ever (each commit writes
        it; the losses' arithmetic, adapters/losses.py). Under `acked:`, the worker's ACL."""
        return f"{self.prefix}:acked:{{{p}}}:entries"

    def losses(self, p: int) -> str:
        """Hash: the partition's losses counted so far (adapters/losses.py)."""
        return f"{self.prefix}:acked:{{{p}}}:losses"

    def commit_seq(self, p: int) -> str:
        """Bumped by every commit of the partition: one GET tells whether states moved."""
        return f"{self.prefix}:seq:{{{p}}}"

    def last_commit(self, p: int) -> str:
        """The token of the partition's last commit: settles a commit whose reply was lost."""
        return f"{self.prefix}:lastcommit:{{{p}}}"

    def route(self, p: int) -> str:
        """The partition count producers must route with to write to p (or `resizing`):
        checked by the producers' function (worker/producers/append_function.py)."""
        return f"{self.prefix}:route:{{{p}}}"

    def moved(self, q: int) -> str:
        """Hash: old partition -> the last of its entries a resize copied into q's stream
        (so a resize run again copies none twice)."""
        return f"{self.prefix}:moved:{{{q}}}"

    # ---- worker coordination -------------------------------------------------------------

    @property
    def config(self) -> str:
        """Hash of what every process must agree on: `partitions` (and `resize_to` while a
        resize is unfinished)."""
        return f"{self.prefix}:config"

    @property
    def workers(self) -> str:
        """Sorted set of live worker processes (lease holder tokens), scored by expiry."""
        return f"{self.prefix}:workers"

    # ---- the model registry ---------------------------------------------------------------

    @property
    def model_seq(self) -> str:
        """INCR gives the next model version."""
        return f"{self.prefix}:model:seq"

    def model_artifact(self, version: str) -> str:
        return f"{self.prefix}:model:{version}"

    def model_meta(self, version: str) -> str:
        return f"{self.prefix}:model:meta:{version}"

    @property
    def model_current(self) -> str:
        return f"{self.prefix}:model:current"

    @property
    def model_shadow(self) -> str:
        """The version every worker also scores with, beside the current (absent = none)."""
        return f"{self.prefix}:model:shadow"

    @property
    def model_history(self) -> str:
        """List of earlier current versions, for rollback."""
        return f"{self.prefix}:model:history"

    @property
    def model_updates(self) -> str:
        """Pub/sub channel announcing promotions."""
        return f"{self.prefix}:model:updates"

    # ---- intent rules ---------------------------------------------------------------------

    @property
    def rules(self) -> str:
        """Hash: rule name -> the rule's JSON, and `:version`, bumped by every change
        (worker/rules/definition.py)."""
        return f"{self.prefix}:rules"

    @property
    def rules_updates(self) -> str:
        """Pub/sub channel announcing each new rules version."""
        return f"{self.prefix}:rules:updates"

    # ---- the console ----------------------------------------------------------------------

    @property
    def console_audit(self) -> str:
        """Stream: every change made through `intentstream console` (who, what, when)."""
        return f"{self.prefix}:console:audit"

    # ---- webhooks (worker/webhooks) ------------------------------------------------------

    @property
    def webhooks(self) -> str:
        """Hash: endpoint name -> the endpoint's JSON (URL, secret, rules, timeout)."""
        return f"{self.prefix}:webhooks"

    def webhook_retries(self, name: str, p: int) -> str:
        """Hash: entry id of partition p's actions -> an endpoint's failures and next due ms
        (deliveries waiting for a retry), in the actions stream's slot."""
        return f"{self.prefix}:webhooks:retry:{name}:{{{p}}}"

    def webhook_deadletter(self, name: str) -> str:
        """Stream of an endpoint's deliveries given up after the maximum age."""
        return f"{self.prefix}:webhooks:deadletter:{name}"
