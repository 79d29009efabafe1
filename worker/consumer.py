"""The worker loop (SPEC §3-§4): read a batch, parse, read states, one kernel call, commit.

Per partition batch, at most three Redis round trips: XREADGROUP (shared by all partitions,
and sent along with the previous commit), one READ_STATES script call (skipped for users in
the state cache), one COMMIT script call that writes states, scores, dead letters and the
XACK atomically, and only if this process still holds the partition's lease, the entries are
still pending for it, no older entry of the partition is pending, and no state moved since
it was read (see worker/scripts.py). Anything else applies nothing, so a crash or a resent
commit never applies an event twice, and unacknowledged entries are read again, in id order,
before new ones.

Partition leases (`{prefix}:lease:{p}`) give each partition one worker at a time, which keeps
each user's events in order; a worker takes every free partition, and a newly taken
partition's pending entries are claimed from whoever held them before.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass

import numpy as np
import redis

from model.scoring import ScoringModel
from worker.batch import Batch, entry_id, length_prefixed, parse_batch
from worker.keys import Keys
from worker.metrics import Health, WorkerMetrics
from worker.model_source import FileModelSource, ModelRejectedError, RegistryModelSource
from worker.registry import Registry, RegistryError
from worker.scripts import ACQUIRE_LEASES, COMMIT, READ_STATES, RELEASE_LEASES
from worker.settings import Settings
from worker.state_cache import StateCache

log = logging.getLogger("intentstream.worker")

_SCORE_ROW = np.dtype([("u", "<i4"), ("t", "<i4"), ("s", "<f4"), ("ts", "<f8")])
_USER_ROW = np.dtype([("s", "<f4"), ("ts", "<f8"), ("n", "<f8")])
_REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def _field(info: dict, name: str):
    """A field of an XINFO reply, whose keys are str or bytes depending on redis-py's parser."""
    return info.get(name, info.get(name.encode()))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _formatted(scores: np.ndarray) -> bytes:
    """Scores as space-separated decimal strings, 9 significant digits (float32 round-trips)."""
    return " ".join(map("{:.9g}".format, scores.tolist())).encode()


class CommitRefusedError(Exception):
    """The commit applied nothing; `reason` is COMMIT's status (see worker/scripts.py)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class Partition:
    """What the loop knows of one partition: lease, read cursor, last claim."""

    index: int
    owned: bool = False
    # "0"-style cursor while re-reading own pending entries; ">" for new ones
    cursor: bytes = b"0"
    last_claim: float = 0.0


class Consumer:
    """One worker process's consumer of the event streams."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        model_source: FileModelSource | RegistryModelSource,
        metrics: WorkerMetrics | None = None,
        health: Health | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.s = settings
        self.r = client
        self.keys = Keys(settings.prefix)
        self.source = model_source
        self.model: ScoringModel = model_source.current
        self.metrics = metrics or WorkerMetrics()
        self.health = health or Health()
        self.lease_ms = settings.lease_ms
        self.stale_consumer_ms = 24 * 3600 * 1000  # a day: restarts leave host-pid consumers
        self.partitions = [Partition(p) for p in range(settings.partitions)]
        self._read_states = client.register_script(READ_STATES)
        self._commit = client.register_script(COMMIT)
        self._acquire = client.register_script(ACQUIRE_LEASES)
        self._release = client.register_script(RELEASE_LEASES)
        # Raw replies: redis-py's XAUTOCLAIM JUSTID parser drops the cursor and the deleted
        # ids, which we need; its XREADGROUP parser builds a dict per entry (~2 µs), which
        # parse_flat_entry does without.
        client.set_response_callback("XAUTOCLAIM", lambda reply, **_: reply)
        client.set_response_callback("XREADGROUP", lambda reply, **_: reply)
        self._stop = stop_event or threading.Event()
        # The lease value: the consumer name plus a token of this process, so two processes
        # started with the same --consumer never both hold a partition.
        self.holder = f"{settings.consumer}:{secrets.token_hex(6)}"
        self.cache = StateCache(settings.state_cache_users, settings.state_ttl_seconds)
        self._last_lease = 0.0
        self._last_trim = 0.0
        self._backoff = 0.0
        self._prefetched: list[tuple[Partition, Batch]] = []
        self._scripts_loaded = False
        self._shapes: dict[str, tuple[int, int] | None] = {}  # state shape by model version

    # ---- lifecycle -------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        """Ask the loop to finish the batch in hand and return."""
        self._stop.set()

    @property
    def _stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, max_seconds: float | None = None) -> None:
        """Consume until stopped (or for max_seconds), surviving Redis outages."""
        self.model.warm_up()
        self.health.model_ok = True
        self._set_model_metrics()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        log.info(
            "worker started",
            extra={"consumer": self.s.consumer, "partitions": self.s.partitions,
                   "model": self.model.version},
        )  # fmt: skip
        while not self._stopping and (deadline is None or time.monotonic() < deadline):
            self.health.beat()
            try:
                self.tick()
                self._backoff = 0.0
                self.health.redis_ok = True
            except _REDIS_DOWN as exc:
                self._redis_trouble(f"redis unavailable: {exc}")
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    log.warning(
                        "consumer group or stream is gone; recreating it", extra={"error": str(exc)}
                    )
                    self.health.group_ok = False
                    self._recreate_groups()
                else:
                    self._redis_trouble(f"unexpected redis reply: {exc}")
            except CommitRefusedError as exc:
                log.warning(
                    "batch not committed; it will be read again", extra={"reason": str(exc)}
                )
                self._rewind()
        self._shutdown()

    def _redis_trouble(self, message: str) -> None:
        self.metrics.redis_errors.inc()
        self._scripts_loaded = False  # a restarted server has none
        self.health.redis_ok = False
        self._backoff = min(5.0, max(0.05, self._backoff * 2))
        log.warning(message + f"; retrying in {self._backoff:.2f} s")
        self._rewind()
        end = time.monotonic() + self._backoff
        while not self._stopping and time.monotonic() < end:
            time.sleep(0.05)

    def _rewind(self) -> None:
        """Re-read own pending entries first: they may hold a batch that did not commit."""
        self._prefetched = []
        self.cache.drop()
        for part in self.partitions:
            part.cursor = b"0"

    def _shutdown(self) -> None:
        """Commit the batches already read (no new reads), then release the leases."""
        try:
            for part, batch in self._take_prefetched([p for p in self.partitions if p.owned]):
                self.process(part, batch)
        except (redis.RedisError, CommitRefusedError) as exc:
            log.warning("read entries left pending at stop", extra={"error": str(exc)})
        try:
            owned = [self.keys.lease(p.index) for p in self.partitions if p.owned]
            if owned:
                self._release(keys=owned, args=[self.holder])
            self.r.zrem(self.keys.workers, self.holder)
        except redis.RedisError as exc:
            log.warning("could not release leases", extra={"error": str(exc)})
        log.info("worker stopped", extra={"consumer": self.s.consumer})

    # ---- one round of the loop ---------------------------------------------------------

    def tick(self) -> None:
        """Leases, maintenance, one read, and the processing of what it returned."""
        now = time.monotonic()
        if not self._scripts_loaded:
            # EVALSHA without a fallback (the prefetching commit) needs them in place
            for script in (READ_STATES, COMMIT, ACQUIRE_LEASES, RELEASE_LEASES):
                self.r.script_load(script)
            self._scripts_loaded = True
        if now - self._last_lease > self.lease_ms / 3000:
            self._renew_leases()
            self._last_lease = now
        try:
            newer = self.source.poll()
        except ModelRejectedError as exc:
            self.metrics.model_reloads.labels("rejected").inc()
            log.error("new model refused; the running model stays", extra={"error": str(exc)})
        else:
            if newer is not None:
                self._swap_model(newer)
        owned = [p for p in self.partitions if p.owned]
        if not owned:
            time.sleep(min(1.0, self.lease_ms / 3000))
            return
        self._claim_idle(owned, now)
        batches = self._take_prefetched(owned) or self._read(owned)
        for k, (part, batch) in enumerate(batches):
            # The last batch's commit travels with a read of the next round, which is parsed
            # while Redis runs the commit (new entries only: pending ones are read in order).
            last = k == len(batches) - 1
            still = [p for p in owned if p.owned]
            prefetch = last and bool(still) and all(p.cursor == b">" for p in still)
            self.process(part, batch, still if prefetch else None)
        if now - self._last_trim > 10:
            self._maintain(owned)
            self._last_trim = now

    def _fair_share(self) -> int:
        """Partitions per live worker, rounded up. Workers announce themselves in a sorted
        set scored by when their announcement expires; expired ones are dropped."""
        now_ms = int(time.time() * 1000)
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(self.keys.workers, {self.holder: now_ms + self.lease_ms})
        pipe.zremrangebyscore(self.keys.workers, "-inf", now_ms)
        pipe.zcard(self.keys.workers)
        live = max(1, int(pipe.execute()[-1]))
        return -(-len(self.partitions) // live)

    def _renew_leases(self) -> None:
        """Renew held leases, take free ones up to the fair share, hand back any beyond it."""
        fair = self._fair_share()
        held_now = sum(p.owned for p in self.partitions)
        got = self._acquire(
            keys=[self.keys.lease(p.index) for p in self.partitions],
            args=[self.holder, self.lease_ms, max(0, fair - held_now)],
        )
        for part, held in zip(self.partitions, got, strict=True):
            if held and not part.owned:
                self._take_over(part)
            elif not held and part.owned:
                log.warning("lost the lease of a partition", extra={"partition": part.index})
                self._let_go(part)
        extra = [p for p in self.partitions if p.owned][fair:]
        if extra:
            # Another worker joined: hand partitions over. Entries read but not committed
            # stay pending; the next holder claims them and applies them first.
            self._prefetched = [(p, b) for p, b in self._prefetched if p not in extra]
            self._release(keys=[self.keys.lease(p.index) for p in extra], args=[self.holder])
            for part in extra:
                self._let_go(part)
            log.info("handed partitions over", extra={"partitions": [p.index for p in extra]})
        self.metrics.partitions_owned.set(sum(p.owned for p in self.partitions))

    def _let_go(self, part: Partition) -> None:
        """Forget a partition this worker no longer holds (its gauges are another's now)."""
        part.owned = False
        self.cache.drop(part.index)
        for gauge in (self.metrics.lag, self.metrics.pending):
            with contextlib.suppress(KeyError):  # never set: nothing to remove
                gauge.remove(str(part.index))

    def _take_over(self, part: Partition) -> None:
        """A newly held partition: make sure the group exists, claim all its pending entries.
        Cached states are dropped: others may have committed while we did not hold it."""
        self.cache.drop(part.index)
        self._ensure_group(part.index)
        self._claim(part, min_idle_ms=0)
        part.owned = True
        part.cursor = b"0"
        log.info("took partition", extra={"partition": part.index})

    def _ensure_group(self, p: int) -> None:
        """Create the group if missing: after the last acknowledged entry when Redis still
        records one (a deleted group), else from the start, so entries published before the
        first worker are scored too."""
        start = (self.r.get(self.keys.acked(p)) or b"0").decode()
        try:
            self.r.xgroup_create(self.keys.events(p), self.s.group, id=start, mkstream=True)
            log.info(
                "created consumer group",
                extra={"partition": p, "group": self.s.group, "from": start},
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.health.group_ok = True

    def _recreate_groups(self) -> None:
        for part in self.partitions:
            if part.owned:
                self._ensure_group(part.index)
        self._rewind()

    def _claim(self, part: Partition, min_idle_ms: int) -> None:
        """Move other consumers' pending entries of this partition to us (ids only)."""
        stream, cursor = self.keys.events(part.index), "0-0"
        while True:
            reply = self.r.execute_command(
                "XAUTOCLAIM", stream, self.s.group, self.s.consumer, min_idle_ms, cursor,
                "COUNT", 1000, "JUSTID",
            )  # fmt: skip
            cursor = reply[0].decode()
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:
                # Trimmed or deleted while pending: never readable again. Counted, logged.
                self.metrics.events.labels("lost").inc(len(deleted))
                log.warning(
                    "pending entries were deleted before they were processed",
                    extra={"partition": part.index, "count": len(deleted)},
                )
            if reply[1]:
                part.cursor = b"0"
            if cursor == "0-0":
                break
        part.last_claim = time.monotonic()

    def _claim_idle(self, owned: list[Partition], now: float) -> None:
        for part in owned:
            if now - part.last_claim > self.s.claim_idle_ms / 2000:
                self._claim(part, self.s.claim_idle_ms)

    def _read(self, owned: list[Partition]) -> list[tuple[Partition, Batch]]:
        """One XREADGROUP over the owned partitions: own pending entries first, then new."""
        streams = {self.keys.events(p.index): p.cursor for p in owned}
        draining = any(p.cursor != b">" for p in owned)
        t0 = time.perf_counter()
        reply = self.r.xreadgroup(
            self.s.group,
            self.s.consumer,
            streams,
            count=self.s.batch_size,
            block=None if draining else self.s.block_ms,
        )
        self.metrics.batch_seconds.labels("read").observe(time.perf_counter() - t0)
        return self._batches(reply, owned)

    def _batches(self, reply, owned: list[Partition]) -> list[tuple[Partition, Batch]]:
        """Parse an XREADGROUP reply into one Batch per partition that has entries."""
        # RESP3 (redis-py 8's default) answers a map, RESP2 a list of [stream, entries]
        pairs = reply.items() if isinstance(reply, dict) else reply or []
        by_stream = {name.decode(): entries for name, entries in pairs}
        out = []
        for part in owned:
            entries = by_stream.get(self.keys.events(part.index), [])
            if part.cursor != b">":
                part.cursor = entries[-1][0] if entries else b">"
            if entries:
                out.append((part, parse_batch(part.index, entries)))
        return out

    def _take_prefetched(self, owned: list[Partition]) -> list[tuple[Partition, Batch]]:
        """The batches read with the last commit, for partitions still held."""
        batches, self._prefetched = self._prefetched, []
        return [(part, b) for part, b in batches if part.owned and part in owned]

    def _send_commit(self, keys: list, args: list, prefetch_for: list[Partition] | None) -> list:
        """Run COMMIT, with a read of the next round behind it when prefetch_for is given."""
        if prefetch_for:
            return self._commit_and_prefetch(keys, args, prefetch_for)
        return self._commit(keys=keys, args=args)

    def _commit_and_prefetch(self, keys: list, args: list, owned: list[Partition]) -> list:
        """Send COMMIT behind a non-blocking read of new entries on one connection; parse the
        read's reply while Redis runs the commit. Any failure drops the read (its entries
        stay pending for us) and rewinds, so they are read again in order."""
        names = [self.keys.events(p.index) for p in owned]
        read = ("XREADGROUP", "GROUP", self.s.group, self.s.consumer, "COUNT",
                self.s.batch_size, "STREAMS", *names, *([">"] * len(names)))  # fmt: skip
        commit = ("EVALSHA", self._commit.sha, len(keys), *keys, *args)
        pool = self.r.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(conn.pack_commands([read, commit]))
            self._prefetched = self._batches(conn.read_response(), owned)
            reply = conn.read_response()
        except redis.exceptions.NoScriptError:
            self._prefetched = []
            self.r.script_load(COMMIT)  # the server lost its scripts (restart, SCRIPT FLUSH)
            self._rewind()
            raise CommitRefusedError("noscript", "COMMIT was not loaded; loaded it") from None
        except BaseException:
            conn.disconnect()  # a reply may still be in flight on it
            self._prefetched = []
            self._rewind()
            raise
        finally:
            pool.release(conn)
        return reply

    # ---- one partition batch -----------------------------------------------------------

    def process(
        self, part: Partition, batch: Batch, prefetch_for: list[Partition] | None = None
    ) -> None:
        """Score one partition's batch and commit it; retry on a state conflict."""
        for attempt in range(5):
            try:
                self._process_once(batch, prefetch_for if attempt == 0 else None)
                return
            except CommitRefusedError as exc:
                self.cache.drop(part.index)
                self.metrics.commit_retries.labels(exc.reason).inc()
                if exc.reason == "not_owned":
                    self._let_go(part)
                    log.warning(
                        "partition lease lost before commit", extra={"partition": part.index}
                    )
                    return
                if exc.reason == "behind":
                    # An older entry is still pending (a read whose commit failed, or one
                    # delivered to another consumer): take them all and re-read in order.
                    log.info("older entries pending; re-reading in order",
                             extra={"partition": part.index})  # fmt: skip
                    self._claim(part, min_idle_ms=0)
                    self._rewind()
                    return
                if exc.reason == "bad_key":
                    raise redis.ResponseError(
                        f"COMMIT refused: {exc}; fix or delete that key"
                    ) from None
                if exc.reason == "not_pending":
                    # Already committed by an earlier send of this call, or claimed by
                    # another worker: either way, not ours to apply.
                    log.info(
                        "batch no longer pending for this consumer", extra={"partition": part.index}
                    )
                    return
                if attempt == 4:
                    raise
                log.info("state conflict; recomputing the batch", extra={"partition": part.index})

    def _process_once(self, batch: Batch, prefetch_for: list[Partition] | None) -> None:
        t1 = time.perf_counter()
        p, model = batch.partition, self.model
        users, types, ts = batch.users, batch.types, batch.ts
        ev_ids, ev_keys, dead = batch.event_ids, batch.event_keys, batch.dead
        distinct = list(dict.fromkeys(users))
        row = {u: i for i, u in enumerate(distinct)}
        slot = np.fromiter((row[u] for u in users), np.int64, len(users))
        seq, state, last_ts, last_id, counts_before = self._read_user_states(p, distinct, model)
        t2 = time.perf_counter()

        # Events at or below their user's last applied id were applied before: ack only.
        keep = np.fromiter(
            (k > last_id[s] for k, s in zip(ev_keys, slot, strict=True)), np.bool_, len(ev_keys)
        )
        n_dup = int(len(keep) - keep.sum())
        idx = np.flatnonzero(keep)
        k_slot = slot[idx]
        type_idx = model.type_indices([types[i] for i in idx])
        k_ts = np.fromiter((ts[i] for i in idx), np.int64, len(idx))
        scores = model.advance(state, last_ts, k_slot, type_idx, k_ts)
        t3 = time.perf_counter()

        touched = np.unique(k_slot)
        last_event = np.full(len(distinct), -1, np.int64)
        np.maximum.at(last_event, k_slot, np.arange(len(idx)))
        per_user = np.zeros(len(touched), _USER_ROW)
        per_user["s"] = scores[last_event[touched]]
        per_user["ts"] = last_ts[touched]
        per_user["n"] = (
            counts_before[touched] + np.bincount(k_slot, minlength=len(distinct))[touched]
        )
        commit_index = np.zeros(len(distinct), np.int32)
        commit_index[touched] = np.arange(1, len(touched) + 1)

        type_names = list(dict.fromkeys(types[i] for i in idx))
        type_pos = {t: i + 1 for i, t in enumerate(type_names)}
        rows = np.zeros(len(idx), _SCORE_ROW)
        rows["u"] = commit_index[k_slot]
        rows["t"] = np.fromiter((type_pos[types[i]] for i in idx), np.int32, len(idx))
        rows["s"] = scores
        rows["ts"] = k_ts

        state_keys = [self.keys.state(p, distinct[i]) for i in touched]
        keys = [self.keys.events(p), self.keys.scores(p), self.keys.deadletter(p),
                self.keys.lease(p), self.keys.commit_seq(p), self.keys.acked(p),
                *state_keys]  # fmt: skip
        args = [
                self.s.group,
                self.s.consumer,
                self.s.scores_maxlen,
                self.s.state_ttl_seconds * 1000,
                model.version,
                len(self.keys.state_prefix(p).encode()),
                b" ".join(batch.ids),
                seq,
                b" ".join(ev_ids[idx[last_event[i]]] for i in touched),
                np.ascontiguousarray(state[touched], "<f4").tobytes(),
                per_user.tobytes(),
                rows.tobytes(),
                b" ".join(ev_ids[i] for i in idx),
                length_prefixed(*(t.encode() for t in type_names)),
                b"".join(dead),
                self.holder,
                _formatted(scores),
                _formatted(per_user["s"]),
        ]  # fmt: skip
        reply = self._send_commit(keys, args, prefetch_for)
        status = reply[0].decode()
        if status != "ok":
            raise CommitRefusedError(status, str(reply[1]))
        t4 = time.perf_counter()
        stamp = time.monotonic()
        self.cache.store(
            p,
            str(reply[2]).encode(),
            {
                distinct[i]: (state[i], lts, ev_keys[idx[last_event[i]]], n, stamp)
                for i, lts, n in zip(
                    touched.tolist(), last_ts[touched].tolist(),
                    per_user["n"].astype(np.int64).tolist(), strict=True,
                )
            },
        )  # fmt: skip

        now = time.time()
        m = self.metrics
        m.events.labels("scored").inc(len(idx))
        m.events.labels("duplicate").inc(n_dup)
        m.events.labels("deadletter").inc(len(dead))
        if batch.lost:
            m.events.labels("lost").inc(batch.lost)
        n_unknown = int((type_idx == model.unknown_index).sum())
        if n_unknown:
            m.unknown_types.inc(n_unknown)
        arrival = np.fromiter((ev_keys[i][0] for i in idx), np.float64, len(idx))
        m.latency.observe_many(np.maximum(0.0, now - arrival / 1000.0))
        m.batch_size.observe(len(batch))
        stages = {
            "parse": batch.parse_seconds,
            "state": t2 - t1,
            "model": t3 - t2,
            "commit": t4 - t3,
        }
        for stage, seconds in stages.items():
            m.batch_seconds.labels(stage).observe(seconds)
        m.last_processed.set(now)
        if dead:
            log.info("dead-lettered entries", extra={"partition": p, "count": len(dead)})

    def _read_user_states(self, p: int, users: list[str], model: ScoringModel):
        """The partition's commit sequence and the batch users' states.

        States come from the cache where it holds them, else from Redis, validated: a state
        of the wrong size (another model's) or with non-finite values restarts from zero,
        counted in intentstream_state_resets_total.
        """
        L, H = model.state_shape
        n = len(users)
        state = np.zeros((n, L, H), np.float32)
        last_ts = np.full(n, -1, np.int64)
        last_id = [(-1, -1)] * n
        counts = np.zeros(n, np.int64)
        seq = self.cache.seq(p)
        cached = self.cache.lookup(p, users) if seq is not None else [None] * n
        misses = [i for i, c in enumerate(cached) if c is None]
        if misses or seq is None:
            flat = self._read_states(
                keys=[self.keys.commit_seq(p), *(self.keys.state(p, users[i]) for i in misses)]
            )
            if seq is not None and (flat[0] or b"") != seq:
                # another commit landed since ours: nothing cached for this partition holds
                self.cache.drop(p)
                return self._read_user_states(p, users, model)
            seq = flat[0] or b""
            self._fill_from_redis(flat, misses, (L, H), state, last_ts, last_id, counts)
        for i, c in enumerate(cached):
            if c is not None:
                state[i], last_ts[i], last_id[i], counts[i], _ = c
        return seq, state, last_ts, last_id, counts

    def _fill_from_redis(self, flat, rows_of, shape, state, last_ts, last_id, counts) -> None:
        """Validate READ_STATES' reply (after the sequence) into the batch's arrays."""
        L, H = shape
        size = L * H * 4
        rows, blobs = [], []
        for k, i in enumerate(rows_of):
            h, lid, lts, written_by, cnt = flat[5 * k + 1 : 5 * k + 6]
            if lid is None:
                continue
            try:
                last_id[i] = entry_id(lid)
                counts[i] = int(cnt or 0)
                last_ts[i] = int(lts) if lts is not None else -1
            except ValueError:
                last_id[i] = (-1, -1)
                self.metrics.state_resets.labels("invalid").inc()
                continue
            other = self._shape_of(written_by.decode(errors="replace")) if written_by else None
            if h is None or len(h) != size or (other is not None and other != shape):
                self.metrics.state_resets.labels("shape").inc()
                continue
            rows.append(i)
            blobs.append(h)
        if rows:
            loaded = np.frombuffer(b"".join(blobs), "<f4").reshape(len(rows), L, H)
            finite = np.isfinite(loaded).all(axis=(1, 2))
            state[np.asarray(rows)[finite]] = loaded[finite]
            if not finite.all():
                self.metrics.state_resets.labels("invalid").inc(int((~finite).sum()))

    def _shape_of(self, version: str) -> tuple[int, int] | None:
        """State shape of the model version that wrote a state: known from models this
        process ran, else from the registry's meta (looked up once); None if unknown."""
        if version == self.model.version:
            return self.model.state_shape
        if version not in self._shapes:
            try:
                meta = Registry(self.r, self.s.prefix).meta(version)
                self._shapes[version] = (int(meta["layers"]), int(meta["hidden"]))
            except (RegistryError, KeyError, TypeError, ValueError):
                self._shapes[version] = None
        return self._shapes[version]

    # ---- model and housekeeping ----------------------------------------------------------

    def _swap_model(self, newer: ScoringModel) -> None:
        """Swap models between batches. States carry over when the state shape is the same;
        else each user's state restarts from zero at their next event (counted)."""
        newer.warm_up()
        old = self.model
        self._shapes[old.version] = old.state_shape
        if newer.state_shape != old.state_shape:
            self.cache.drop()
        self.model = newer
        self.metrics.model_reloads.labels("loaded").inc()
        self._set_model_metrics()
        log.info("model swapped", extra={"old": old.version, "new": newer.version})

    def _set_model_metrics(self) -> None:
        version = self.model.version
        self.metrics.model_version.set(int(version) if version.isdigit() else 0)

    def _maintain(self, owned: list[Partition]) -> None:
        """Lag and pending gauges; trim input history past retention, never past unacked;
        forget consumers of the group long idle with nothing pending."""
        now_ms = int(time.time() * 1000)
        for part in owned:
            stream = self.keys.events(part.index)
            groups = self.r.xinfo_groups(stream)
            bound: tuple[int, int] | None = None
            for g in groups:
                name = _text(_field(g, "name"))
                pending = int(_field(g, "pending") or 0)
                last = _text(_field(g, "last-delivered-id") or "0-0")
                if name == self.s.group:
                    lag = _field(g, "lag")
                    if lag is not None:
                        self.metrics.lag.labels(str(part.index)).set(int(lag))
                    self.metrics.pending.labels(str(part.index)).set(pending)
                ms, seq = entry_id(last.encode())
                keep_from = (ms, seq + 1)  # delivered and acked up to last-delivered
                if pending:
                    first = self.r.xpending(stream, name)["min"]
                    keep_from = min(keep_from, entry_id(first))
                bound = keep_from if bound is None else min(bound, keep_from)
            if self.s.retention_seconds and bound is not None:
                cut = min((now_ms - self.s.retention_seconds * 1000, 0), bound)
                if cut[0] > 0:
                    self.r.xtrim(stream, minid=f"{cut[0]}-{cut[1]}", approximate=True)
            self._forget_idle_consumers(stream)

    def _forget_idle_consumers(self, stream: str) -> None:
        """Each restart under the default name (host and pid) leaves a consumer behind in the
        group; drop those idle for `stale_consumer_ms` with no pending entries."""
        for c in self.r.xinfo_consumers(stream, self.s.group):
            name = _text(_field(c, "name"))
            idle = int(_field(c, "idle") or 0)
            pending = int(_field(c, "pending") or 0)
            if name != self.s.consumer and not pending and idle > self.stale_consumer_ms:
                self.r.xgroup_delconsumer(stream, self.s.group, name)
                log.info("removed an idle consumer", extra={"consumer_removed": name})
