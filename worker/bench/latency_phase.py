"""The scaling bench's latency phase: events published at a fixed rate in bursts (or one by
one at random gaps, as many users' clicks come), each one's latency taken from its entry id's
time to its score entry's (Redis's clock both, whole ms: commit time minus arrival, without
the producer's own time to build and send) and, on one Redis, as a reader of the scores sees
it from the producer's send (observer.py, to the µs).

Several systems (a Redis and its workers each) can share one phase (`run_bursts`): their
bursts spread evenly over each period, or, for events one by one, a second of each in turn.
Each sees the host's drift of the same seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

import numpy as np

from model.data.synthetic import EVENT_TYPES
from worker.bench.observer import Observer, sent_id
from worker.common.connection import Client
from worker.common.keys import Keys
from worker.producers.publisher import publish

KEYS = Keys()


def id_ms(entry_id: bytes | str) -> int:
    """A stream entry id's time, ms."""
    raw = entry_id.encode() if isinstance(entry_id, str) else entry_id
    return int(raw.split(b"-")[0])


def whole_ms_percentile(ms: np.ndarray, q: float) -> float:
    """The q-th percentile of latencies counted in whole ms (each the difference of two
    ids' times: the true one within a ms either side), read as if each spread evenly over
    its ms: 2.3 where a bare percentile can only say 2 or 3."""
    values, counts = np.unique(ms, return_counts=True)
    below = np.concatenate([[0], np.cumsum(counts)]) / len(ms)
    k = int(np.searchsorted(below[1:], q / 100))
    k = min(k, len(values) - 1)
    return float(values[k] - 0.5 + (q / 100 - below[k]) / (below[k + 1] - below[k]))


def wait(condition, timeout: float, what: str, procs: list) -> None:
    """Until `condition()`; RuntimeError when a worker of `procs` exits or on the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def scored(client: Client, partitions: int) -> int:
    """Score entries over the partitions' score streams."""
    pipe = client.pipeline(transaction=False)
    for p in range(partitions):
        pipe.xlen(KEYS.scores(p))
    return sum(pipe.execute())


class Burster(Protocol):
    """What `run_bursts` sends to: a Feed, or a test's recorder."""

    def burst(self, chunk: int) -> None: ...


class Feed:
    """One system's side of a latency phase: the bursts it was sent, each event's entry
    time, and (on one Redis, `url`) the reader of its scores."""

    def __init__(
        self, client: Client, partitions: int, users: int, url: str | None,
        rng: np.random.Generator | None = None,
    ) -> None:  # fmt: skip
        self.client, self.partitions = client, partitions
        self.before = scored(client, partitions)
        self.starts = {p: _last_id(client, KEYS.scores(p)) for p in range(partitions)}
        self.observer = None
        if url is not None:
            self.observer = Observer(url, {KEYS.scores(p): s for p, s in self.starts.items()})
        self.users = [f"u{i}" for i in range(users)]
        # the same seed for every system: each is sent the same users and types (a phase of
        # several rounds hands on its generator, so a round's users are not the last one's)
        self.rng = rng if rng is not None else np.random.default_rng(2)
        self.entered: dict[bytes, int] = {}  # event_id -> its entry's id time
        self.sent = 0

    def burst(self, chunk: int) -> None:
        """Publish `chunk` events at once, as one producer's call."""
        now_ms = int(time.time() * 1000)
        picks = zip(self.rng.integers(0, len(self.users), chunk),
                    self.rng.integers(0, len(EVENT_TYPES), chunk), strict=True)  # fmt: skip
        batch = [
            {"user_id": self.users[u], "type": EVENT_TYPES[t], "ts": now_ms,
             "event_id": sent_id(self.sent + i)}
            for i, (u, t) in enumerate(picks)
        ]  # fmt: skip
        ids = publish(self.client, batch, partitions=self.partitions, pipeline_size=chunk)
        for event, entry in zip(batch, ids, strict=True):
            self.entered[event["event_id"].encode()] = id_ms(entry)
        self.sent += chunk

    def latencies(self, procs: list) -> tuple[np.ndarray, np.ndarray]:
        """Once every event sent is scored: the entry-to-score latencies (whole ms) and those
        the reader saw (ms; empty without one)."""
        wait(lambda: scored(self.client, self.partitions) >= self.before + self.sent, 120,
             "latency phase", procs)  # fmt: skip
        seen = self.observer.stop() if self.observer is not None else np.zeros(0)
        latencies = []
        for p in range(self.partitions):
            for sid, f in self.client.xrange(KEYS.scores(p), f"({self.starts[p].decode()}", "+"):
                latencies.append(id_ms(sid) - self.entered[f[b"event_id"]])
        return np.asarray(latencies, np.float64), seen


def _last_id(client: Client, stream: str) -> bytes:
    """The stream's last id generated; 0-0 before it exists (no score yet)."""
    if not client.exists(stream):
        return b"0-0"
    last = client.xinfo_stream(stream)["last-generated-id"]
    return last if isinstance(last, bytes) else last.encode()


# Several feeds' bursts go within each period, spread evenly, when this far apart (ms) or
# more (two feeds, bursts 10 ms apart: 5 ms): a round of a few ms ends before the next
# feed's burst comes
SPACING_MS = 5.0
SLICE_SECONDS = 1.0  # closer bursts go to one feed at a time, for this long each in turn
# How late a burst may come after its place, at random. The ids time entry and score in whole
# ms, and a schedule of whole periods from one start sends every burst at the same point of
# its ms: that moved a run's entry-to-score figure by up to half a ms either way (P = 1 1.02 ms
# in three rounds, 1.95 in the next three). At random points the whole ms average out.
PHASE_MS = 1.0


def run_bursts(
    feeds: list[Burster], seconds: float, rate: float, every_ms: float,
    slice_seconds: float = SLICE_SECONDS, phase_ms: float = PHASE_MS, poisson: bool = False,
) -> None:  # fmt: skip
    """Send each feed `rate` events/s for `seconds`, in bursts `every_ms` apart, each up to
    `phase_ms` late at random (PHASE_MS); `poisson`: one event at a time, the gaps drawn at
    random (exponential, 1 / rate on average), as many users' clicks come. Several feeds:
    each period sends every feed its burst in turn, spread evenly over it, when they come
    SPACING_MS apart or more; closer (events one by one, whose rounds would run at once) go
    to one feed a slice at a time, in turn, each feed `seconds` in all."""
    # a shop's events come one by one; the default's bursts leave the worker idle between
    # rounds, so what it does after a commit is off their latency
    chunk = 1 if poisson else max(1, round(rate * every_ms / 1000))
    period = chunk / rate
    rng = np.random.default_rng(3)
    if poisson:  # lateness is moot: the gaps fall at random points of the ms already
        late, gap = (lambda: 0.0), partial(rng.exponential, period)
    else:
        late, gap = partial(rng.uniform, 0.0, phase_ms / 1000), (lambda: period)
    t0 = time.monotonic()
    if len(feeds) == 1 or period / len(feeds) * 1000 >= SPACING_MS:
        _send(feeds, t0, 0.0, seconds, period, chunk, late, gap)
        return
    slices = max(1, round(seconds / slice_seconds))
    length = seconds / slices
    for k in range(slices * len(feeds)):
        _send([feeds[k % len(feeds)]], t0, k * length, (k + 1) * length, period, chunk, late,
              gap)  # fmt: skip


def _send(
    feeds: list[Burster], t0: float, start: float, stop: float, period: float, chunk: int,
    late: Callable[[], float], gap: Callable[[], float],
) -> None:  # fmt: skip
    """A burst of `chunk` to each feed from `start` to `stop` (seconds after `t0`), `gap()`
    seconds after the one before, the feeds' spread evenly over `period`, each `late()`
    seconds after its place. The schedule is the clock's: a burst sent late does not push
    the next ones back."""
    at = start
    while True:
        for i, feed in enumerate(feeds):
            due = at + i * period / len(feeds)
            if due >= stop - 1e-9:
                return
            ahead = due + late() - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
            feed.burst(chunk)
        at += gap()


def latency_phase(
    client: Client, args, rate: float, procs: list, url: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Publish at `rate` for args.latency_seconds; per-event latency in whole ms, from the
    event entry's id time to its score entry's; and, on one Redis (`url`), the latency a
    reader of the scores sees, ms to the µs (empty on a cluster)."""
    feed = Feed(client, args.partitions, args.users, url)
    run_bursts(
        [feed], args.latency_seconds, rate, args.latency_every_ms, poisson=args.latency_poisson
    )
    return feed.latencies(procs)
