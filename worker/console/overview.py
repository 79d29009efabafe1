"""The overview's figures, from keys and streams that exist (no key scans): per partition one
pipelined round of XINFO STREAM (events, scores, actions), XINFO GROUPS, the lease and the
newest dead letters; the live workers' sorted set; the registry's current and shadow.

Rates are differences of the streams' `entries-added` between samples (XLEN on a Redis
before 7.0); a second of caching keeps many open pages at one round a second.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

import redis

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.common.partition_count import recorded_partitions
from worker.engine.adapters.lag import undelivered
from worker.rules.store import rules_version

KINDS = ("events", "scores", "actions")
CACHE_SECONDS = 1.0
# Rates are measured over the newest samples at most this old.
RATE_WINDOW_SECONDS = 10.0
# Dead letters read per partition, newest first, to count their reasons.
DEAD_LETTERS_READ = 200
# The lag is counted by XRANGE pages only up to this when Redis's counter cannot be used.
LAG_COUNT_CAP = 10_000


@dataclass(frozen=True)
class Sample:
    at: float
    added: dict[str, int]


def _field(info: dict, name: str):
    return info.get(name, info.get(name.encode()))


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def reason_of(error: str) -> str:
    """A dead letter's reason: its error text before the first ':' (a short, stable head)."""
    return error.split(":", 1)[0].strip()[:60] or "(none)"


class Overview:
    """The figures of the overview page, sampled at most once per CACHE_SECONDS."""

    def __init__(self, client: Client, keys: Keys, group: str, partitions: int) -> None:
        self.r, self.keys, self.group, self.default_partitions = client, keys, group, partitions
        self.samples: deque[Sample] = deque(maxlen=64)
        self._lock = threading.Lock()
        self._cached: tuple[float, dict] | None = None

    def figures(self) -> dict:
        """The overview as JSON-ready data (the page renders it, the poll refreshes it)."""
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_SECONDS:
                return self._cached[1]
            figures = self._read(now)
            self._cached = (now, figures)
            return figures

    def _read(self, now: float) -> dict:
        partitions = recorded_partitions(self.r, self.keys) or self.default_partitions
        rows = [self._partition(p) for p in range(partitions)]
        added = {k: sum(row.pop(f"{k}_added") for row in rows) for k in KINDS}
        self.samples.append(Sample(now, added))
        reasons: Counter[str] = Counter()
        for row in rows:
            reasons.update(row.pop("dead_reasons"))
        workers = self._workers()
        holders = Counter(row["holder"] for row in rows if row["holder"])
        return {
            "partitions": rows,
            "rates": self.rates(),
            "totals": added,
            "dead_letters": dict(reasons.most_common()),
            "dead_letters_total": sum(row["dead_letters"] for row in rows),
            "workers": [{"name": w, "partitions": holders.get(w, 0)} for w in workers],
            "model": self._model(),
            "rules_version": rules_version(self.r, self.keys),
            "sampled_at": time.time(),
        }

    def rates(self) -> dict[str, float | None]:
        """Entries per second of each kind over the sampling window (None until two samples)."""
        newest = self.samples[-1]
        within = [s for s in self.samples if newest.at - s.at <= RATE_WINDOW_SECONDS]
        oldest = within[0]
        span = newest.at - oldest.at
        if span <= 0:
            return dict.fromkeys(KINDS)
        return {k: max(0.0, (newest.added[k] - oldest.added[k]) / span) for k in KINDS}

    def _partition(self, p: int) -> dict:
        k = self.keys
        pipe = self.r.pipeline(transaction=False)
        for stream in (k.events(p), k.scores(p), k.actions(p)):
            pipe.xinfo_stream(stream)
        pipe.xinfo_groups(k.events(p))
        pipe.get(k.lease(p))
        pipe.xlen(k.deadletter(p))
        pipe.xrevrange(k.deadletter(p), count=DEAD_LETTERS_READ)
        *infos, groups, lease, dead_len, dead = pipe.execute(raise_on_error=False)
        row: dict = {"partition": p}
        for kind, info in zip(KINDS, infos, strict=True):
            row[f"{kind}_added"] = _added(info)
        group = _group(groups, self.group)
        row["lag"] = self._lag(k.events(p), group)
        row["holder"] = _text(lease).rsplit(":", 1)[0] if isinstance(lease, bytes) else None
        row["dead_letters"] = dead_len if isinstance(dead_len, int) else 0
        row["dead_reasons"] = Counter(
            reason_of(_text(fields.get(b"error", b""))) for _, fields in _list(dead)
        )
        return row

    def _lag(self, stream: str, group: dict | None) -> int | None:
        if group is None:
            return None
        try:
            return undelivered(self.r, stream, group, cap=LAG_COUNT_CAP)
        except redis.ResponseError:
            return None

    def _workers(self) -> list[str]:
        now_ms = int(time.time() * 1000)
        live = self.r.zrangebyscore(self.keys.workers, now_ms, "+inf")
        return sorted(_text(w).rsplit(":", 1)[0] for w in live)

    def _model(self) -> dict[str, str | None]:
        current, shadow = self.r.mget(self.keys.model_current, self.keys.model_shadow)
        return {
            "current": _text(current) if current is not None else None,
            "shadow": _text(shadow) if shadow is not None else None,
        }


def _added(info) -> int:
    """Entries ever added to a stream (0 when it does not exist yet)."""
    if not isinstance(info, dict):
        return 0
    added = _field(info, "entries-added")
    return int(added if added is not None else _field(info, "length") or 0)


def _group(groups, name: str) -> dict | None:
    for g in _list(groups):
        if _text(_field(g, "name")) == name:
            return g
    return None


def _list(reply) -> list:
    return reply if isinstance(reply, list) else []
