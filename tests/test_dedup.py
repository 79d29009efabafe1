"""A user's resend memory (worker/common/dedup.py) against a plain reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.dedup import (
    MAX_PRODUCERS,
    Memory,
    ResendWindow,
    bounded,
    generated_event_id,
    parse_times,
)

EVENTS = st.lists(
    st.tuples(
        # ids that are parts of each other: a match must be a whole id
        st.none() | st.sampled_from([b"a", b"b", b"ab", b"ba", b"aba", b"c", b"e"]),
        st.none() | st.tuples(st.sampled_from([b"p", b"q", b"r"]), st.integers(1, 12)),
        st.integers(0, 4),  # seconds since the event before
    ),
    max_size=40,
)


def reference(events, window: ResendWindow) -> tuple[list[bool], int]:
    """Admit each event unless its own id was admitted within the last `window.seconds`
    and is still among the last `window.ids` own ids admitted, or its producer already had
    this or a higher sequence admitted (all in plain lists); and count the ids dropped by
    the bound while still within the time."""
    applied: list[tuple[bytes, int]] = []  # every own id admitted, with its time
    last: dict[bytes, int] = {}
    out, t = [], 0
    for event_id, producer, step in events:
        t += step
        own = event_id is not None and (
            producer is None or event_id != generated_event_id(producer)
        )
        kept = applied[-window.ids :]
        dup = own and any(i == event_id and s >= t - window.seconds for i, s in kept)
        if producer is not None and not dup:
            dup = producer[1] <= last.get(producer[0], 0)
        out.append(not dup)
        if not dup:
            if producer is not None:
                last[producer[0]] = producer[1]
            if own:
                applied.append((event_id, t))
    overflow = sum(
        1
        for k, (_, s) in enumerate(applied)
        if any(s >= u - window.seconds for _, u in applied[k + window.ids : k + window.ids + 1])
    )
    return out, overflow


@settings(max_examples=400, deadline=None)
@given(
    events=EVENTS,
    window=st.builds(ResendWindow, st.integers(0, 8), st.integers(1, 6)),
    split=st.integers(0, 40),
)
def test_memory_admits_as_the_reference_across_a_commit_boundary(events, window, split):
    m, t, got = Memory(b"", window), 0, []
    for k, (event_id, producer, step) in enumerate(events):
        if k == split:  # what the commit writes is what the next batch reads
            overflow, m = m.overflow, Memory(m.packed(), window)
            m.overflow = overflow
        t += step
        got.append(m.admit(event_id, producer, t))
    assert (got, m.overflow) == reference(events, window)


def test_memory_keeps_at_most_max_producers_and_the_bound():
    m = Memory(b"", ResendWindow(3600, 2))
    for i in range(MAX_PRODUCERS + 3):
        assert m.admit(b"id%d" % i, (b"p%d" % i, 1), 100 + i)
    ids, _, rest = m.packed().partition(b"\n")
    marks, _, times = rest.partition(b"\n")
    assert ids == b"id%d id%d" % (MAX_PRODUCERS + 1, MAX_PRODUCERS + 2)
    assert times == b"%d 1" % (100 + MAX_PRODUCERS + 1)
    assert len(marks.split()) == MAX_PRODUCERS
    assert m.overflow == MAX_PRODUCERS + 1  # all pushed out within the hour


def test_a_hostile_stored_memory_is_cut_and_garbage_marks_are_ignored():
    packed = b" ".join(b"x%d" % i for i in range(5000)) + b"\n" + b"junk p:3 :9 q:x " * 50
    cut = bounded(packed + b"\n" + b"1 " * 5000)
    ids, _, rest = cut.partition(b"\n")
    assert len(ids.split()) == 1024 and b"\n" not in rest  # the times no longer match: gone
    m = Memory(cut, ResendWindow())
    assert not m.admit(None, (b"p", 3), 10) and m.admit(None, (b"q", 1), 10)


def test_times_are_read_in_the_worker_form_only():
    assert parse_times(b"1700000000 0 5", 3) == [1700000000, 1700000000, 1700000005]
    for odd in (b"1 2", b"01 2 3", b"1  2 3", b"1 2 3 ", b"1 x 3", b"9" * 13 + b" 0 0"):
        assert parse_times(odd, 3) is None
