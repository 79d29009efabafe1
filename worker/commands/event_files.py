"""Event files as the commands read them (files, stdin): JSON lines, Open CDP / REES46 CSV or
CSV with a column mapping (`--format`, `--columns`); bad lines reported on stderr and skipped."""

from __future__ import annotations

import gzip
import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TextIO

from model.data.opencdp import OPENCDP, MappingError, csv_events, parse_mapping
from worker.common.events import EVENT_FIELDS, SCALARS, Event, numbered_events
from worker.common.settings import SettingsError

FORMATS = ("jsonl", "opencdp", "csv")


def data_format(format: str = "jsonl", columns: str | None = None):
    """The CsvFormat of `--format`/`--columns` (None for JSON lines); SettingsError when they
    do not fit together or the mapping is unusable."""
    if columns is not None and format != "csv":
        raise SettingsError("--columns is the mapping of --format csv")
    if format == "jsonl":
        return None
    if format == "opencdp":
        return OPENCDP
    if format == "csv":
        if not columns:
            raise SettingsError("--format csv needs --columns user_id=COL,type=COL[,ts=COL,...]")
        try:
            return parse_mapping(columns)
        except MappingError as exc:
            raise SettingsError(f"--columns: {exc}") from None
    raise SettingsError(f"--format: {format!r} is not one of {', '.join(FORMATS)}")


def _open(path: str) -> TextIO:
    """A text file, gunzipped when its name ends in .gz; universal newlines left to csv."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_event_files(paths: list[str], format: str = "jsonl", columns: str | None = None
                     ) -> list[dict]:  # fmt: skip
    """Events of JSON-lines or CSV files (`data_format`); bad lines are reported (the first
    ten) and skipped. CSV events keep their extra mapped fields (strings), JSON-lines events
    their other scalar keys (strings and numbers as the line has them)."""
    fmt = data_format(format, columns)
    events, bad = [], 0
    for path in paths:

        def report(number: int, exc: object, path: str = path) -> None:
            nonlocal bad
            bad += 1
            if bad <= 10:
                print(f"{path}:{number}: {exc}", file=sys.stderr)

        try:
            with _open(path) as f:
                if fmt is None:
                    fields: deque[dict] = deque()
                    for e in numbered_events(recording_fields(f, fields), report):
                        extra = fields.popleft()
                        if e is not None:
                            event = extra | {"user_id": e.user_id, "type": e.type, "ts": e.ts}
                            if e.event_id is not None:  # a backtest's actions name it
                                event["event_id"] = e.event_id
                            events.append(event)
                else:
                    events.extend(csv_events(f, fmt, report))
        except OSError as exc:
            raise SettingsError(f"cannot read --data {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SettingsError(
                f"cannot read --data {path}: not UTF-8 text ({exc.reason})"
            ) from None
        except MappingError as exc:
            raise SettingsError(f"--data {path}: {exc}") from None
    if bad:
        print(f"skipped {bad} bad line(s)", file=sys.stderr)
    return events


def recording_fields(
    lines: Iterable[str], out: deque[dict], names: Iterable[str] | None = None
) -> Iterator[str]:
    """The lines as they are, recording on `out` each non-blank line's extra fields (the
    lines the event parser yields an event or a None for): those of `names` whose values are
    scalars (strings, numbers, booleans) as they are, or without names every other scalar
    key; {} when the line is no JSON object."""
    wanted = list(names) if names is not None else None
    for line in lines:
        if line.strip():
            try:
                doc = json.loads(line)
            except (ValueError, RecursionError):
                doc = None
            if not isinstance(doc, dict):
                out.append({})
            elif wanted is not None:  # a null, an object or a list reads as absent
                out.append({n: doc[n] for n in wanted if isinstance(doc.get(n), SCALARS)})
            else:
                out.append({k: v for k, v in doc.items()
                            if k not in EVENT_FIELDS and isinstance(v, SCALARS)})  # fmt: skip
        yield line


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
