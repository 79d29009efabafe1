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
- event ids: the last `window` producer `event_id`s applied (producers that set only
  their own ids). A resend is recognised while the user has had at most `window` other
  ids applied since its first copy.

Packed: b"<id> <id> ...\\n<producer>:<seq> <producer>:<seq> ..." (oldest first; ids and
producer ids hold neither spaces nor newlines).
"""

from __future__ import annotations

MAX_PRODUCERS = 8
MAX_WINDOW = 1024  # the largest event-id window setting
DEFAULT_WINDOW = 32

Producer = tuple[bytes, int]  # (producer id, sequence number)


def generated_event_id(producer: Producer) -> bytes:
    """The event id `publish()` gives an event that has none: its producer stamp."""
    return producer[0] + b"-" + str(producer[1]).encode()


def bounded(packed: bytes) -> bytes:
    """A stored memory cut to what any setting keeps (a hostile field stays small)."""
    ids, sep, marks = packed.partition(b"\n")
    ids = b" ".join(ids.split()[-MAX_WINDOW:])
    if not sep:
        return ids
    return ids + b"\n" + b" ".join(marks.split()[-MAX_PRODUCERS:])


class Memory:
    """One user's memory while a batch is decided; `packed()` is what the commit writes."""

    __slots__ = ("_count", "_marks", "_producers", "ids", "window")

    def __init__(self, packed: bytes, window: int) -> None:
        ids, _, self._marks = packed.partition(b"\n")
        self.ids = ids
        self.window = window
        self._count = -1  # ids in `ids`, counted on first use
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

    def _seen_id(self, event_id: bytes) -> bool:
        """Whether event_id is one of the space-separated ids (a whole one, found in place:
        no copy of the window per event)."""
        ids, n = self.ids, len(event_id)
        at = ids.find(event_id)
        while at >= 0:
            end = at + n
            if (at == 0 or ids[at - 1] == 32) and (end == len(ids) or ids[end] == 32):
                return True
            at = ids.find(event_id, at + 1)
        return False

    def _remember_id(self, event_id: bytes) -> None:
        if self._count < 0:
            self._count = self.ids.count(b" ") + 1 if self.ids else 0
        ids = self.ids + b" " + event_id if self.ids else event_id
        self._count += 1
        while self._count > self.window:  # the oldest ids go
            ids = ids[ids.index(b" ") + 1 :]
            self._count -= 1
        self.ids = ids

    def admit(self, event_id: bytes | None, producer: Producer | None) -> bool:
        """True when the event is new (and remember it), False when it is a resend."""
        own_id = event_id is not None and (
            producer is None or event_id != generated_event_id(producer)
        )
        if own_id and self._seen_id(event_id):
            return False
        if producer is not None and not self._admit_producer(*producer):
            return False
        if own_id:
            self._remember_id(event_id)
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
        if self._producers is None:
            marks = self._marks
        else:
            marks = b" ".join(b"%b:%d" % kv for kv in self._producers.items())
        return self.ids + b"\n" + marks if marks else self.ids
