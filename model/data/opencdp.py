"""Shop events from CSV: the Open CDP / REES46 format and a generic column mapping, read into
the event dicts training takes (`user_id`, `type`, `ts` in epoch ms), in file order.

The Open CDP format (the REES46 "eCommerce behavior data from multi category store" dataset,
credit: REES46 Marketing Platform, rees46.com; Kaggle
`mkechinov/ecommerce-behavior-data-from-multi-category-store`) has the columns
`event_time,event_type,product_id,category_id,category_code,brand,price,user_id,user_session`:
`event_time` `2019-10-01 00:00:00 UTC` becomes `ts`; `event_type` is kept as the shop names
it (view, cart, remove_from_cart, purchase): the live shop sends the same names, and a model
trained on its export must know them (the label is chosen by `--label-type`, default
purchase); `product_id`, `category_code`, `brand` and `price` are kept as
strings (an empty one is left out) for inputs and baselines that read them.

A generic CSV takes a mapping `user_id=visitorid,type=event,ts=timestamp[,field=column...]`:
`user_id` and `type` are required; `ts` is epoch milliseconds (a number from 1e11 on), epoch
seconds (a smaller number, decimals allowed) or ISO 8601 (`2015-06-02T05:02:12`, a trailing
`Z`, ` UTC` or offset; no zone is UTC); every other name keeps that column as a string field.

A bad row (wrong number of fields, an empty user or type, an unreadable time, a truncated
last line) is reported through `on_error(line number, reason)` and skipped, never raised.
"""

from __future__ import annotations

import csv
import datetime
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

OPENCDP_HEADER = ("event_time", "event_type", "product_id", "category_id", "category_code",
                  "brand", "price", "user_id", "user_session")  # fmt: skip
# Event types are kept as the shop names them: no renaming (a model trained on the export
# knows the names the live shop sends).
OPENCDP_TYPES: dict[str, str] = {}
# The fields an event keeps beyond user_id, type and ts (strings; absent when empty).
OPENCDP_FIELDS = ("product_id", "category_code", "brand", "price")
REQUIRED = ("user_id", "type")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_MS_FROM = 1e11  # a numeric ts at or above this is epoch ms (1973 on); below, epoch seconds


class MappingError(ValueError):
    """A column mapping that cannot be used; the message says why."""


@dataclass(frozen=True)
class CsvFormat:
    """How a CSV's columns become an event: field name → column name, and the event types'
    renaming (others kept)."""

    columns: dict[str, str]
    types: dict[str, str] = field(default_factory=dict)
    # The column whose values are UUIDs: a last line cut short there is caught (Open CDP).
    uuid_column: str | None = None


OPENCDP = CsvFormat(
    {"ts": "event_time", "type": "event_type", "user_id": "user_id",
     **{f: f for f in OPENCDP_FIELDS}},
    OPENCDP_TYPES,
    uuid_column="user_session",
)  # fmt: skip


def parse_mapping(text: str) -> CsvFormat:
    """`user_id=visitorid,type=event,ts=timestamp` → a CsvFormat; MappingError when unusable."""
    columns: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, column = (s.strip() for s in part.partition("="))
        if not eq or not name or not column:
            raise MappingError(f"{part!r}: expected FIELD=COLUMN")
        if name in columns:
            raise MappingError(f"{name!r} is mapped twice")
        columns[name] = column
    missing = [r for r in REQUIRED if r not in columns]
    if missing:
        raise MappingError(f"the mapping needs {' and '.join(missing)} (e.g. user_id=visitorid)")
    return CsvFormat(columns)


def parse_ts(text: str) -> int:
    """Epoch ms of a CSV time: epoch ms, epoch seconds or ISO 8601 (see the module doc)."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value != value or abs(value) == float("inf"):
            raise ValueError(f"time {text!r} is not a number")
        return round(value if abs(value) >= _MS_FROM else value * 1000)
    iso = text[:-4] if text.endswith(" UTC") else text
    iso = iso[:-1] + "+00:00" if iso.endswith("Z") else iso
    try:
        when = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"time {text!r} is neither epoch ms, epoch s nor ISO 8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return round(when.timestamp() * 1000)


class _Lines:
    """The lines of a file, remembering whether the last one read had its line end."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines, self.ended = iter(lines), True

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            self.ended = line.endswith(("\n", "\r"))
            yield line


def csv_events(
    lines: Iterable[str], fmt: CsvFormat, on_error: Callable[[int, str], None]
) -> Iterator[dict]:
    """Events of CSV lines (a header row first) in file order; a bad row calls
    on_error(line number, reason) and is skipped. A header without a mapped column raises
    MappingError (nothing could be read)."""
    source = _Lines(lines)
    reader = csv.reader(source)
    header = next(reader, None)
    if header is None:
        return
    header = [h.strip().lstrip("\ufeff") for h in header]
    where = {h: i for i, h in enumerate(header)}
    missing = [c for c in fmt.columns.values() if c not in where]
    if missing:
        raise MappingError(f"column(s) {', '.join(missing)} not in the header ({','.join(header)})")
    index = {name: where[column] for name, column in fmt.columns.items()}
    uuid_at = where.get(fmt.uuid_column) if fmt.uuid_column else None
    width, line, last_time, last_ts = len(header), reader.line_num, None, 0
    for row in reader:
        number, line = line + 1, reader.line_num
        if not row or row == [""]:
            continue
        if len(row) != width:
            cut = " (a truncated line?)" if len(row) < width else ""
            on_error(number, f"{len(row)} fields, expected {width}{cut}")
            continue
        if uuid_at is not None and not source.ended and not _UUID.fullmatch(row[uuid_at]):
            on_error(number, f"truncated last line: {fmt.uuid_column} {row[uuid_at]!r}")
            continue
        event: dict = {}
        problem = None
        for name, i in index.items():
            value = row[i].strip()
            if name == "ts":
                if value == last_time:
                    event["ts"] = last_ts
                    continue
                try:
                    event["ts"] = last_ts = parse_ts(value)
                    last_time = value
                except ValueError as exc:
                    problem = f"{fmt.columns['ts']}: {exc}"
                    break
            elif name == "type":
                event["type"] = fmt.types.get(value, value)
            elif value:
                event[name] = value
        if problem is None:
            empty = [fmt.columns[r] for r in REQUIRED if not event.get(r)]
            if empty:
                problem = f"empty {' and '.join(empty)}"
        if problem is not None:
            on_error(number, problem)
            continue
        yield event


def opencdp_events(lines: Iterable[str], on_error: Callable[[int, str], None]) -> Iterator[dict]:
    """Events of Open CDP / REES46 CSV lines (see the module doc)."""
    return csv_events(lines, OPENCDP, on_error)
