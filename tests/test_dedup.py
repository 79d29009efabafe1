"""A user's resend memory (worker/common/dedup.py) against a plain reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.dedup import MAX_PRODUCERS, Memory, bounded, generated_event_id

EVENTS = st.lists(
    st.tuples(
        # ids that are parts of each other: a match must be a whole id
        st.none() | st.sampled_from([b"a", b"b", b"ab", b"ba", b"aba", b"c", b"e"]),
        st.none() | st.tuples(st.sampled_from([b"p", b"q", b"r"]), st.integers(1, 12)),
    ),
    max_size=40,
)


def reference(events, window: int) -> list[bool]:
    """Admit each event unless its own id is among the last `window` own ids admitted, or
    its producer already had this or a higher sequence admitted (all in plain lists)."""
    ids: list[bytes] = []
    last: dict[bytes, int] = {}
    out = []
    for event_id, producer in events:
        own = event_id is not None and (
            producer is None or event_id != generated_event_id(producer)
        )
        dup = own and event_id in ids[-window:]
        if producer is not None and not dup:
            dup = producer[1] <= last.get(producer[0], 0)
        out.append(not dup)
        if not dup:
            if producer is not None:
                last[producer[0]] = producer[1]
            if own:
                ids.append(event_id)
    return out


@settings(max_examples=400, deadline=None)
@given(events=EVENTS, window=st.integers(1, 6), split=st.integers(0, 40))
def test_memory_admits_as_the_reference_across_a_commit_boundary(events, window, split):
    m = Memory(b"", window)
    got = [m.admit(*e) for e in events[:split]]
    m = Memory(m.packed(), window)  # what the commit writes is what the next batch reads
    got += [m.admit(*e) for e in events[split:]]
    assert got == reference(events, window)


def test_memory_keeps_at_most_max_producers_and_the_window():
    m = Memory(b"", 2)
    for i in range(MAX_PRODUCERS + 3):
        assert m.admit(b"id%d" % i, (b"p%d" % i, 1))
    ids, _, marks = m.packed().partition(b"\n")
    assert ids == b"id%d id%d" % (MAX_PRODUCERS + 1, MAX_PRODUCERS + 2)
    assert len(marks.split()) == MAX_PRODUCERS


def test_a_hostile_stored_memory_is_cut_and_garbage_marks_are_ignored():
    packed = b" ".join(b"x%d" % i for i in range(5000)) + b"\n" + b"junk p:3 :9 q:x " * 50
    cut = bounded(packed)
    assert len(cut.partition(b"\n")[0].split()) == 1024
    m = Memory(cut, 32)
    assert not m.admit(None, (b"p", 3)) and m.admit(None, (b"q", 1))
