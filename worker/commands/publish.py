"""The `intentstream publish` command: JSON-lines or synthetic events to the partition streams,
at a given rate or as fast as Redis takes them."""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator

import redis

from model.data.synthetic import synthetic_events
from worker.commands.event_files import chunks, recording_fields, reported_events
from worker.common.connection import connect_settings, name_wrong_type
from worker.common.events import Event
from worker.common.keys import Keys
from worker.common.settings import SettingsError, load_settings
from worker.producers.publisher import publish


def synthetic_backlog(args: argparse.Namespace, now_ms: int | None = None) -> list[dict]:
    """The synthetic events, from --start-ms or else dated so that the last one is now (the
    generator's clock runs faster than real time: its span is known only once generated)."""
    events = list(synthetic_events(args.synthetic, args.users, seed=args.seed,
                                   start_ms=args.start_ms or 0))  # fmt: skip
    if args.start_ms is None and events:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        shift = now_ms - events[-1]["ts"]
        for event in events:
            event["ts"] += shift
    return events


def file_events(lines: Iterable[str]) -> Iterator[dict | None]:
    """JSON-lines events as mappings with their other scalar fields (the inputs a model may
    declare); a bad line is reported on stderr as `line N: reason` and yields None."""
    extras: deque[dict] = deque()
    for event in reported_events(recording_fields(lines, extras), sys.stderr):
        extra = extras.popleft()
        if event is not None:
            yield extra | event.model_dump(exclude_none=True)
        else:
            yield None


def cmd_publish(args: argparse.Namespace) -> int:
    """The `intentstream publish` command; returns its exit code."""
    try:
        # a producer never blocks on a read: the worker's block_ms rule is not its concern
        settings = load_settings(args, model=None, block_ms=1)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    client = connect_settings(settings)
    bad = 0
    if args.synthetic is not None:
        if args.rate:  # live: dated by Redis as they arrive (docs/producers.md, Timestamps)
            live = synthetic_events(args.synthetic, args.users, seed=args.seed)
            events: Iterable[Event | dict] = (
                {k: v for k, v in e.items() if k != "ts"} for e in live
            )
        else:
            events = synthetic_backlog(args)
    else:
        source = open(args.events, encoding="utf-8") if args.events else sys.stdin  # noqa: SIM115
        events = list(file_events(source))
        bad = sum(e is None for e in events)
        events = [e for e in events if e is not None]
    chunk = max(1, int(args.rate / 10)) if args.rate else 1000
    sent = 0
    t0 = time.monotonic()
    for part in chunks(iter(events), chunk):
        try:
            publish(client, part, settings.prefix, settings.partitions, pipeline_size=chunk)
        except SettingsError as exc:  # another partition count is in force
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except redis.ResponseError as exc:  # name the key of another type, if one is
            keys = Keys(settings.prefix)
            expected = {keys.config: "hash"}
            expected |= {keys.events(p): "stream" for p in range(settings.partitions)}
            name_wrong_type(client, exc, expected)
            raise
        sent += len(part)
        if args.rate:
            ahead = sent / args.rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    elapsed = time.monotonic() - t0
    print(f"published {sent} events in {elapsed:.2f} s", file=sys.stderr)
    if bad:
        print(f"{bad} bad line(s) skipped", file=sys.stderr)
        return 1
    return 0
