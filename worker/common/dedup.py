"""What a user's state remembers to recognise a producer's resend (docs/producers.md,
Retries and deduplication).

Two memories, packed in the state's one `event_ids` field so that it travels through the
state read, the cache and the commit as one bytes value:

- producer sequences: for each of the user's last MAX_PRODUCERS producers, the highest
  sequence number applied. `publish()` stamps every event `producer: <id>:<seq>` with a
  sequence that rises in send order, and a resend repeats the same stamps in the same
  order, so an event at or below its producer's applied sequence is a resend, whatever
  the resend's size (Kafka's idempotent producer, per user rather than per partition:
  a user's events are a subsequence of the partition's, and the state commits atomically);
- event ids: the producer `event_id`s applied within the last `seconds` (by their entries'
  id times), at most `ids` of them. A resend is recognised while its first copy is in that
  window; an id pushed out by the bound before its time is counted (`overflow`).

Packed: b"<id> <id> ...\\n<producer>:<seq> ...\\n<time> <delta> ..." (oldest first; ids and
producer ids hold neither spaces nor newlines; the times are the ids' entry times in seconds,
the first whole, each next one as the seconds since the one before; no times line without
ids). A memory with ids and no readable times (an earlier release's) takes the time of the
first event that checks it, as if applied then.
"""

from __future__ import annotations

from itertools import pairwise
from typing import NamedTuple

MAX_PRODUCERS = 8
MAX_WINDOW = 1024  # the largest event-id bound setting
DEFAULT_WINDOW = 1024
DEFAULT_WINDOW_SECONDS = 24 * 3600
MAX_TIME = 10**12 - 1  # seconds: a time of 12 digits at most (year 33658)

Producer = tuple[bytes, int]  # (producer id, sequence number)


class ResendWindow(NamedTuple):
    """How long, and how many, own event ids a user's memory keeps."""

    seconds: int = DEFAULT_WINDOW_SECONDS
    ids: int = DEFAULT_WINDOW


DEFAULT_RESENDS = ResendWindow()


def generated_event_id(producer: Producer) -> bytes:
    """The event id `publish()` gives an event that has none: its producer stamp."""
    return producer[0] + b"-" + str(producer[1]).encode()


def bounded(packed: bytes) -> bytes:
    """A stored memory cut to what any setting keeps (a hostile field stays small); times
    that no longer match the ids are dropped."""
    ids, sep, rest = packed.partition(b"\n")
    marks, tsep, times = rest.partition(b"\n")
    kept = ids.split()
    ids = b" ".join(kept[-MAX_WINDOW:])
    if not sep:
        return ids
    out = ids + b"\n" + b" ".join(marks.split()[-MAX_PRODUCERS:])
    if tsep and len(kept) <= MAX_WINDOW and len(times) <= 13 * MAX_WINDOW:
        out += b"\n" + times
    return out


def parse_times(raw: bytes, n: int) -> list[int] | None:
    """The n absolute times packed in raw (the first whole, then deltas), or None when raw is
    not n of them in the worker's form (digits, no leading zero, within MAX_TIME)."""
    tokens = raw.split(b" ") if raw else []
    if len(tokens) != n:
        return None
    out, at = [], 0
    for tok in tokens:
        if not tok.isdigit() or len(tok) > 12 or (tok[0] == 48 and len(tok) > 1):
            return None
        at += int(tok)
        if at > MAX_TIME:
            return None
        out.append(at)
    return out


def packed_times(times: list[int]) -> bytes:
    """Times packed as parse_times reads them."""
    deltas = [times[0]] + [b - a for a, b in pairwise(times)]
    return b" ".join(b"%d" % d for d in deltas)


class Memory:
    """One user's memory while a batch is decided; `packed()` is what the commit writes."""

    __slots__ = ("_ids", "_marks", "_now", "_producers", "_raw_ids", "_raw_times", "_times",
                 "overflow", "window")  # fmt: skip

    def __init__(self, packed: bytes, window: ResendWindow) -> None:
        self._raw_ids, _, rest = packed.partition(b"\n")
        self._marks, _, self._raw_times = rest.partition(b"\n")
        self.window = window
        self.overflow = 0  # ids pushed out by the bound before their time
        self._now = -1  # the first checked event's time: an earlier release's ids take it
        self._ids: list[bytes] | None = None  # parsed on first use
        self._times: list[int] = []
        self._producers: dict[bytes, int] | None = None  # parsed on first use

    def producers(self) -> dict[bytes, int]:
        """Producer id -> highest applied sequence, oldest producer first."""
        if self._producers is None:
            self._producers = {}
            for mark in self._marks.split():
                pid, _, seq = mark.rpartition(b":")
                if pid and seq.isdigit():
                    self._producers[pid] = int(seq)
        return self._producers

    def ids(self) -> list[bytes]:
        """The remembered own ids, oldest first (their times in `_times`)."""
        if self._ids is None:
            self._ids = self._raw_ids.split(b" ") if self._raw_ids else []
            times = parse_times(self._raw_times, len(self._ids)) if self._ids else []
            self._times = times if times is not None else [self._now] * len(self._ids)
        return self._ids

    def _seen_id(self, event_id: bytes, t: int) -> bool:
        """Whether event_id was applied at `t - seconds` or later (the newest ids last)."""
        ids, times, since = self.ids(), self._times, t - self.window.seconds
        for k in range(len(ids) - 1, -1, -1):
            if times[k] < since:
                return False
            if ids[k] == event_id:
                return True
        return False

    def _remember_id(self, event_id: bytes, t: int) -> None:
        ids, times = self.ids(), self._times
        if times:
            t = max(t, times[-1])  # times never go back (a clock behind, a hand-set id)
        ids.append(event_id)
        times.append(t)
        since = t - self.window.seconds
        cut = 0
        while times[cut] < since:  # past the window: forgotten by right
            cut += 1
        over = max(0, len(ids) - cut - self.window.ids)
        self.overflow += over  # still in the window: forgotten by the bound
        if cut + over:
            del ids[: cut + over], times[: cut + over]

    def admit(self, event_id: bytes | None, producer: Producer | None, t: int) -> bool:
        """True when the event (its entry's time `t`, seconds) is new (and remember it),
        False when it is a resend."""
        t = min(t, MAX_TIME)
        if self._now < 0:
            self._now = t
        own_id = event_id is not None and (
            producer is None or event_id != generated_event_id(producer)
        )
        if own_id and self._seen_id(event_id, t):
            return False
        if producer is not None and not self._admit_producer(*producer):
            return False
        if own_id:
            self._remember_id(event_id, t)
        return True

    def _admit_producer(self, pid: bytes, seq: int) -> bool:
        """Whether (pid, seq) is above what pid applied; if so it becomes pid's mark."""
        if self._producers is None:
            # most users hear from one producer at a time: decided on the packed marks
            marks = self._marks
            if not marks:
                self._marks = b"%b:%d" % (pid, seq)
                return True
            if b" " not in marks and marks.startswith(pid + b":"):
                last = marks[len(pid) + 1 :]
                if last.isdigit() and seq <= int(last):
                    return False
                self._marks = b"%b:%d" % (pid, seq)
                return True
        producers = self.producers()
        last = producers.pop(pid, None)
        if last is not None and seq <= last:
            producers[pid] = last
            return False
        producers[pid] = seq
        while len(producers) > MAX_PRODUCERS:
            del producers[next(iter(producers))]
        return True

    def packed(self) -> bytes:
        """The memory in the worker's form (an earlier release's ids take their times)."""
        if self._producers is None:
            marks = self._marks
        else:
            marks = b" ".join(b"%b:%d" % kv for kv in self._producers.items())
        ids = self.ids() if self._raw_ids or self._ids is not None else []
        if ids:
            return b" ".join(ids) + b"\n" + marks + b"\n" + packed_times(self._times)
        return b"\n" + marks if marks else b""
