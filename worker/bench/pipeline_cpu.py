"""The worker's pipeline without Redis, for `intentstream bench --inputs`: what the declared
inputs cost the computation alone.

Each 512-entry batch of the backlog, as XREADGROUP returns it, goes through what the worker
does between its reads and its commits: the parse (with the declared inputs' values), the
states from the write-through cache (a user seen for the first time is new), `build_commit`,
the commit's checks and transaction packed to bytes, and the cache's copy of what it
writes. No socket, no reply parsing, no state read from Redis: the rest of the bench's
difference is there and in Redis. Timed with process time under the worker's garbage
collection, the two models stepping through the batches in lockstep; the figure is the
median of the rounds' paired differences, which a shared machine's slow spells disturb less
than either model's time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import redis

from model.scoring import ScoringModel
from worker.bench.workload import entry_fields
from worker.common.keys import Keys
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.states import FIELDS as STATE_FIELDS
from worker.engine.adapters.states import StateReader
from worker.engine.compute.batch import parse_batch
from worker.engine.compute.pipeline import Commit, build_commit
from worker.engine.compute.state_cache import StateCache, written
from worker.engine.compute.user_states import distinct_users
from worker.engine.models import tune_gc

BATCH = 512


def entries_of(events: list[dict], fields: tuple[str, ...]) -> list[list]:
    """The events as batches of XREADGROUP entries ([id, [field, value, ...]]) of the fields
    the bench's preload publishes (`entry_fields`, with producer event ids). Each entry id's
    time is its event's `ts` (the events come in time order), as when a producer publishes
    as the events happen: an id far behind its `ts` would dead-letter the event."""
    batches = []
    for k in range(0, len(events), BATCH):
        entries = []
        for i, e in enumerate(events[k : k + BATCH], start=k):
            flat = [str(x).encode() for x in entry_fields(e, i, True, fields)]
            entries.append([f"{e['ts']}-{i}".encode(), flat])
        batches.append(entries)
    return batches


def pipeline_commits(
    model: ScoringModel, batches: list[list], history_events: int
) -> Iterator[Commit]:
    """The worker's commit of each batch, its users' states from the cache of the commits
    before it (a user seen for the first time is new), from an empty cache."""
    client = redis.Redis()  # never connected
    cache = StateCache(10**8)
    reader = StateReader(client, Keys(), cache, lambda _version: model.version)
    names, width, seq = tuple(model.input_names), len(STATE_FIELDS), 1
    after = b"0-0"
    for entries in batches:
        batch = parse_batch(0, entries, input_names=names)
        batch.after, after = after, batch.ids[-1]  # each batch follows the one before
        request = reader.request(0, distinct_users(batch))
        # what the read returns for users Redis has no state of
        read = [str(seq).encode()] + [None] * (width * len(request.misses))
        states = reader.complete(request, read, model.state_shape, model.version)
        commit = build_commit(batch, states, model, history_events)
        yield commit
        seq += 1
        cache.store(0, str(seq).encode(), written(commit))


def step_seconds(model: ScoringModel, batches: list[list], history_events: int) -> Iterator[float]:
    """Process time of each batch's step through the pipeline (its commit built and packed,
    the cache's copy of the one before stored), from an empty cache."""
    committer = Committer(redis.Redis(), Keys(), "h", CommitLimits(10**8, 1000, 256, 0))
    commits = pipeline_commits(model, batches, history_events)
    while True:
        t = time.process_time()
        commit = next(commits, None)
        if commit is None:
            return
        committer.checks(commit)
        committer.prepare(commit)
        yield time.process_time() - t


def pipeline_cost(
    plain: ScoringModel, rich: ScoringModel, batches: list[list], history_events: int,
    rounds: int,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """µs/event of the pipeline per round for each model, under the worker's garbage
    collection (the backlog frozen as the objects made at start are: a full collection
    walking it cost more than the inputs do). The two models step batch by batch in
    lockstep, which goes first alternating, so that a slow spell of a shared machine falls
    on both: their difference per round is paired."""
    tune_gc()
    n = sum(map(len, batches))
    times: dict[str, list[float]] = {"plain": [], "rich": []}
    for k in range(rounds):
        steps = {"plain": step_seconds(plain, batches, history_events),
                 "rich": step_seconds(rich, batches, history_events)}  # fmt: skip
        total = dict.fromkeys(steps, 0.0)
        for i in range(len(batches)):
            for name in ("plain", "rich") if (i + k) % 2 == 0 else ("rich", "plain"):
                total[name] += next(steps[name])
        for name, seconds in total.items():
            times[name].append(seconds / n * 1e6)
    return times["plain"], times["rich"]


def print_pipeline_cost(plain: list[float], rich: list[float]) -> None:
    """The pipeline's figures, and the inputs' cost as the difference of the fastest rounds."""
    print(f"\nthe worker's pipeline without Redis (parse, states from the cache, build_commit, "
          f"the commit packed), {len(plain)} rounds alternated, µs/event:")  # fmt: skip
    for name, times in (("type-only model", plain), ("the model reading the 4 fields", rich)):
        print(f"  {name:<44} fastest {min(times):6.2f}  median {np.median(times):6.2f}  rounds "
              + " ".join(f"{x:.2f}" for x in times))  # fmt: skip
    paired = np.subtract(rich, plain)
    print(
        f"the inputs add {np.median(paired):.2f} µs per event to the pipeline (median of the "
        f"rounds' paired differences: "
        + " ".join(f"{x:.2f}" for x in paired)
        + f"; fastest rounds {min(rich) - min(plain):.2f}; goal <= 2 for the worker)"
    )
