"""JSON-lines events as the commands read them (files, stdin): bad lines reported on stderr
and skipped."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TextIO

from worker.common.events import Event, EventError, numbered_events
from worker.common.settings import SettingsError


def read_event_files(paths: list[str]) -> list[dict]:
    """Events of JSON-lines files; bad lines are reported (the first ten) and skipped."""
    events, bad = [], 0
    for path in paths:

        def report(number: int, exc: EventError, path: str = path) -> None:
            nonlocal bad
            bad += 1
            if bad <= 10:
                print(f"{path}:{number}: {exc}", file=sys.stderr)

        try:
            with open(path, encoding="utf-8") as f:
                for e in numbered_events(f, report):
                    if e is not None:
                        events.append({"user_id": e.user_id, "type": e.type, "ts": e.ts})
        except OSError as exc:
            raise SettingsError(f"cannot read --data {path}: {exc.strerror}") from None
    if bad:
        print(f"skipped {bad} bad line(s)", file=sys.stderr)
    return events


def reported_events(lines: Iterable[str], errors: TextIO) -> Iterator[Event | None]:
    """JSON-lines events; a bad line is reported on `errors` as `line N: reason` (and
    yields None)."""
    return numbered_events(lines, lambda n, exc: print(f"line {n}: {exc}", file=errors))


def chunks(events: Iterator[Event | None], size: int) -> Iterator[list[Event | None]]:
    """The events in lists of `size` (the last may be shorter)."""
    chunk: list[Event | None] = []
    for event in events:
        chunk.append(event)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
