"""One sender: a consumer of an endpoint's group that POSTs each action, acknowledges it only
after a 2xx, keeps failed ones for their retry (backoff.py) and dead-letters those past the
maximum age. An endpoint has several senders, each in a thread of its own; the endpoints'
senders share nothing but the process, so a slow endpoint holds back only its own."""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import redis

from worker.common.connection import Client, refresh_topology
from worker.common.keys import Keys
from worker.webhooks.attempt import Attempt
from worker.webhooks.backoff import RetrySchedule
from worker.webhooks.deadletters import add_dead_letter, dead_letter_fields
from worker.webhooks.endpoints import Endpoint
from worker.webhooks.group import ActionsGroup, Entry
from worker.webhooks.metrics import DeliveryMetrics
from worker.webhooks.payload import Delivery, from_entry
from worker.webhooks.post import EndpointClient
from worker.webhooks.retries import RetryBook
from worker.webhooks.trimmed import TrimmedCount

log = logging.getLogger("intentstream.webhooks")

READ_COUNT = 100  # entries per read


@dataclass(frozen=True)
class SenderConfig:
    """What every sender of the process shares: the schedule and the pacing."""

    schedule: RetrySchedule
    max_held: int
    claim_idle_ms: int
    block_ms: int
    measure_seconds: float  # between two measures of the oldest undelivered action


@dataclass(order=True)
class _Held:
    due: float
    seq: int
    delivery: Delivery = field(compare=False)
    failures: int = field(compare=False)


class Sender:
    """One consumer of one endpoint's group; `run` until `stop` is set."""

    def __init__(
        self,
        client: Client,
        keys: Keys,
        endpoint: Endpoint,
        group: ActionsGroup,
        http: EndpointClient,
        config: SenderConfig,
        metrics: DeliveryMetrics,
        stop: threading.Event,
        measures_oldest: bool = False,
    ) -> None:
        self.client, self.keys, self.endpoint, self.group = client, keys, endpoint, group
        self.http, self.config, self.metrics, self.stop = http, config, metrics, stop
        self.measures_oldest = measures_oldest
        self.held: list[_Held] = []  # a heap by due time
        self.working: dict[int, set[bytes]] = defaultdict(set)  # read, not yet acked
        self.acks: dict[int, list[bytes]] = defaultdict(list)
        self.dead: list[dict[str, object]] = []
        self.book = RetryBook(keys, endpoint.name)
        self.trimmed = TrimmedCount(client, keys, endpoint.group, len(group.streams))
        self._seq = itertools.count()
        self._started = False
        self._failing = False
        self._touched = self._claimed = self._measured = time.monotonic()

    def run(self) -> None:
        """Rounds until stopped; a Redis error waits (0.5 s doubling to 10 s) and goes on."""
        wait = 0.5
        while not self.stop.is_set():
            try:
                self.round()
                wait = 0.5
            except redis.RedisError as exc:
                self.metrics.redis_errors.inc()
                log.warning(
                    "redis error; retrying",
                    extra={
                        "endpoint": self.endpoint.name,
                        "error": f"{type(exc).__name__}: {exc}",
                        "retry_in_s": wait,
                    },
                )
                refresh_topology(self.client)
                self._started = False  # its pending entries read again (those not held)
                self.stop.wait(wait)
                wait = min(wait * 2, 10.0)
        self._flush_quietly()

    def round(self) -> None:
        """Settle what is owed to Redis, retry what is due, take over abandoned entries, read
        new ones (blocking until the next retry is due at most)."""
        if not self._started:
            if self.client.hget(self.keys.webhooks, self.endpoint.name) is None:
                self.stop.wait(1.0)  # removed: its groups are not made again; stopped soon
                return
            self.group.ensure()  # a group deleted (or a Redis without AOF): made again
            self._read_own()
            self._started = True
        self._flush()
        self._touch_if_due()  # held retries may wait minutes: keep them marked as worked on
        self._retry_due()
        now = time.monotonic()
        if now - self._claimed > self.config.claim_idle_ms / 2000:
            claimed = self.group.claim_abandoned(self.config.claim_idle_ms, READ_COUNT)
            # a full step: more may wait (a dead deliverer's backlog), take them next round
            self._claimed = now if len(claimed) < READ_COUNT else 0.0
            self._deliver_all(claimed, pending=True)
        if self.measures_oldest and now - self._measured > self.config.measure_seconds:
            self._measured = now
            self._measure_oldest()
        room = self.config.max_held - len(self.held)
        next_due = self.held[0].due - time.time() if self.held else None
        if room <= 0:
            self.stop.wait(min(1.0, max(next_due or 0.0, 0.0)))
            return
        block = (
            self.config.block_ms
            if next_due is None
            else int(min(self.config.block_ms, max(next_due * 1000, 1)))
        )
        self._deliver_all(self.group.read(min(READ_COUNT, room), block))
        self._flush()

    def _read_own(self) -> None:
        """Deliver this consumer's pending entries that it does not hold for a retry."""
        after: dict[int, bytes] = {}
        while not self.stop.is_set():
            entries = self.group.read_own(READ_COUNT, after)
            if not entries:
                return
            for p, eid, _ in entries:
                after[p] = eid
            mine = {(h.delivery.partition, h.delivery.entry_id.encode()) for h in self.held}
            mine |= {(p, eid) for p, ids in self.acks.items() for eid in ids}
            self._deliver_all([e for e in entries if (e[0], e[1]) not in mine], pending=True)

    def _deliver_all(self, entries: list[Entry], pending: bool = False) -> None:
        """Settle the lost and skipped entries; POST the others, as one batch. Entries read
        again (`pending`) go on with the backoff recorded in Redis, if any."""
        batch: list[tuple[Delivery, int]] = []
        records = (
            self.book.load(self.client, [(p, e) for p, e, f in entries if f]) if pending else {}
        )
        now = time.time()
        for p, eid, fields in entries:
            self.working[p].add(eid)
            if fields is None:  # trimmed from the stream before it was delivered
                self._done(p, eid, "lost")
                log.error(
                    "action trimmed before delivery",
                    extra={
                        "endpoint": self.endpoint.name,
                        "partition": p,
                        "entry_id": eid.decode(),
                    },
                )
                continue
            delivery = from_entry(p, eid, fields)
            if not self.endpoint.wants(delivery.rule):
                self._done(p, eid, "skipped")
                continue
            failures, due = records.get((p, eid), (0, now))
            if due > now:
                heapq.heappush(self.held, _Held(due, next(self._seq), delivery, failures))
            else:
                batch.append((delivery, failures))
        self._send(batch)

    def _send(self, batch: list[tuple[Delivery, int]]) -> None:
        """POST a batch (deliveries with their failures so far) and settle each attempt; one
        not sent (stopped) stays pending, for this consumer or another to take again."""
        if not batch:
            return
        future = self.http.submit([d for d, _ in batch], self.stop)
        while True:  # held entries stay marked as worked on through a long batch
            try:
                attempts = future.result(timeout=self.config.claim_idle_ms / 3000)
                break
            except concurrent.futures.TimeoutError:
                self._touch_if_due()
        for (delivery, failures), attempt in zip(batch, attempts, strict=True):
            if attempt is not None:
                self._settle(delivery, failures, attempt)

    def _settle(self, delivery: Delivery, failures: int, attempt: Attempt) -> None:
        """Acknowledge a delivered one; hold a failed one for its retry, or dead-letter it."""
        name = self.endpoint.name
        self.metrics.attempts.labels(name, attempt.result).inc()
        p, eid = delivery.partition, delivery.entry_id.encode()
        if failures:
            self.book.settled(p, eid)  # written again below if it fails once more
        if attempt.ok:
            self.metrics.latency.labels(name).observe(
                max(time.time() - delivery.committed_ms / 1000, 0.0)
            )
            self._done(delivery.partition, delivery.entry_id.encode(), "delivered")
            if self._failing:
                self._failing = False
                log.info("endpoint delivering again", extra={"endpoint": name})
            return
        failures += 1
        if not self._failing:
            self._failing = True
            log.warning(
                "delivery failed; retrying with backoff",
                extra={
                    "endpoint": name,
                    "webhook_id": delivery.webhook_id,
                    "result": attempt.describe(),
                },
            )
        age = time.time() - delivery.committed_ms / 1000
        if self.config.schedule.expired(age):
            self.dead.append(dead_letter_fields(delivery, failures, attempt))
            self._done(delivery.partition, delivery.entry_id.encode(), "dead_letter")
            log.error(
                "delivery given up: dead letter",
                extra={
                    "endpoint": name,
                    "webhook_id": delivery.webhook_id,
                    "attempts": failures,
                    "result": attempt.describe(),
                    "age_s": round(age, 1),
                },
            )
            return
        due = time.time() + self.config.schedule.wait(failures)
        heapq.heappush(self.held, _Held(due, next(self._seq), delivery, failures))
        self.book.failed(p, eid, failures, due)

    def _retry_due(self) -> None:
        """POST the held deliveries now due, as one batch."""
        now, batch = time.time(), []
        while self.held and self.held[0].due <= now:
            held = heapq.heappop(self.held)
            batch.append((held.delivery, held.failures))
        self._send(batch)

    def _done(self, p: int, eid: bytes, outcome: str) -> None:
        """Queue the entry's XACK (sent by _flush) and count its outcome."""
        self.acks[p].append(eid)
        self.metrics.deliveries.labels(self.endpoint.name, outcome).inc()

    def _flush(self) -> None:
        """The dead letters and the retry records, then the acknowledgements (XADD before
        XACK: a crash between them repeats a dead letter, never loses one)."""
        if not self.dead and not self.book.changes and not any(self.acks.values()):
            return
        if self.dead or self.book.changes:
            pipe = self.client.pipeline(transaction=False)
            for fields in self.dead:
                add_dead_letter(pipe, self.keys, self.endpoint.name, fields)
            self.book.queue(pipe)
            pipe.execute()
            self.dead = []
        self.group.ack(self.acks)
        for p, ids in self.acks.items():
            self.working[p].difference_update(ids)
        self.acks = defaultdict(list)

    def _flush_quietly(self) -> None:
        with contextlib.suppress(redis.RedisError):  # left pending: delivered again later
            self._flush()

    def _touch_if_due(self) -> None:
        """Every third of the claim time, mark the entries this sender holds as worked on."""
        now = time.monotonic()
        if now - self._touched < self.config.claim_idle_ms / 3000:
            return
        self._touched = now
        self.group.touch({p: list(ids) for p, ids in self.working.items()})

    def _measure_oldest(self) -> None:
        """The oldest undelivered action's age, and the actions trimmed before they were read
        (counted lost: they cannot be delivered)."""
        oldest = self.group.oldest_ms()
        age = 0.0 if oldest is None else max(time.time() - oldest / 1000, 0.0)
        self.metrics.oldest.labels(self.endpoint.name).set(age)
        for p, lost in self.trimmed.new_losses().items():
            self.metrics.deliveries.labels(self.endpoint.name, "lost").inc(lost)
            log.error(
                "actions trimmed before delivery",
                extra={"endpoint": self.endpoint.name, "partition": p, "actions": lost},
            )
