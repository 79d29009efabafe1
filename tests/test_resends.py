"""The batch's resends found by the kernel (worker/engine/compute/resends.py) are the ones a
`Memory` per user finds (worker/common/dedup.py), with the same memories written back and the
same overflow counted, whatever the memories, times and events hold; and a memory the worker
wrote takes the kernel."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.dedup import ResendWindow, generated_event_id
from worker.engine.compute import resends

PIDS = [b"p", b"shop-a", b"b" * 64, b"q1", b"r", b"s", b"t", b"u", b"v", b"w"]
IDS = st.sampled_from([b"e1", b"e2", b"e3", b"p-1", b"p-2", b"x" * 128, b"!~"])
PRODUCER = st.tuples(st.sampled_from(PIDS), st.integers(0, 10**18 - 1) | st.integers(0, 6))
# what a memory read from Redis can hold (after dedup.bounded): the worker's own, and others
MARK = st.tuples(st.sampled_from(PIDS), st.integers(0, 9)).map(lambda m: b"%b:%d" % m)
ODD_MARK = st.sampled_from([b"p:007", b"p:", b":3", b"a:b:5", b"p:1x", b"\xff:1", b"p:1" * 7,
                            b"p:" + b"9" * 30, b"p:1\tq:2", b" p:1", b"p:1 "])  # fmt: skip
MARKS = st.lists(MARK, max_size=10).map(b" ".join) | st.lists(
    MARK | ODD_MARK, min_size=1, max_size=4
).map(b" ".join)
ID_LISTS = st.lists(IDS | st.sampled_from([b"", b"\xfe"]), max_size=40)
TIME = st.integers(0, 40) | st.integers(10**11, 10**12 - 1)
ODD_TIMES = st.sampled_from([b"", b"07", b"1 ", b" 1", b"1  2", b"x", b"9" * 13, b"-1"])


@st.composite
def memories(draw, marks_of=MARKS):
    """A stored memory: ids with their times as the worker writes them, or in other forms
    (no times, times that do not match, odd bytes)."""
    ids = draw(ID_LISTS)
    joined = b" ".join(ids)
    kind = draw(st.sampled_from(["empty", "ids only", "old", "worker", "odd times"]))
    if kind == "empty":
        return b""
    if kind == "ids only":
        return joined
    marks = draw(marks_of)
    if kind == "old" or not ids:
        return joined + b"\n" + marks
    if kind == "odd times":
        n = draw(st.integers(0, len(ids) + 1))
        times = b" ".join(b"%d" % draw(TIME) for _ in range(n))
        return joined + b"\n" + marks + b"\n" + draw(st.just(times) | ODD_TIMES)
    deltas = [draw(TIME)] + [draw(st.integers(0, 30)) for _ in ids[1:]]
    return joined + b"\n" + marks + b"\n" + b" ".join(b"%d" % d for d in deltas)


@st.composite
def batches(draw, marks_of=MARKS):
    """Stored memories of a few users and a batch of their events, some resent, at entry
    times that mostly rise (a clock may go back a little)."""
    users = draw(st.integers(1, 4))
    stored = [draw(memories(marks_of)) for _ in range(users)]
    n = draw(st.integers(1, 40))
    events = []
    t = draw(TIME)
    for _ in range(n):
        t = max(0, t + draw(st.integers(-2, 20)))
        if events and draw(st.booleans()):
            user, event_id, producer, _ = draw(st.sampled_from(events))
            events.append((user, event_id, producer, t))  # a resend
            continue
        producer = draw(st.none() | PRODUCER)
        generated = producer is not None and draw(st.booleans())
        event_id = generated_event_id(producer) if generated else draw(st.none() | IDS)
        events.append((draw(st.integers(0, users - 1)), event_id, producer, t))
    keep = np.array([draw(st.booleans()) or draw(st.booleans()) for _ in range(n)])
    window = ResendWindow(draw(st.sampled_from([1, 5, 30, 86400])),
                          draw(st.sampled_from([1, 2, 3, 32])))  # fmt: skip
    return stored, events, keep, window


def decided(way, stored, events, keep, window):
    keep = keep.copy()
    slot = np.array([e[0] for e in events], np.int64)
    ids, producers = [e[1] for e in events], [e[2] for e in events]
    seconds = np.array([e[3] for e in events], np.int64)
    return way(stored, slot, keep, ids, producers, seconds, window), keep.tolist()


@settings(max_examples=400, deadline=None)
@given(batches())
def test_the_kernel_decides_as_memory_objects_do(case):
    expected = decided(resends.memories_by_object, *case)
    assert decided(resends.memories_after, *case) == expected
    found = decided(resends._by_kernel, *case)
    if found[0] is not None:
        assert found == expected


@settings(max_examples=200, deadline=None)
@given(batches(st.lists(MARK, max_size=8, unique_by=lambda m: m.split(b":")[0]).map(b" ".join)))
def test_what_the_worker_writes_the_kernel_reads(case):
    """A memory written once (its ids' times missing, odd or fine; its marks the worker's)
    is in the worker's form: the kernel takes it from then on."""
    stored, events, keep, window = case
    (written, _), _ = decided(resends.memories_by_object, *case)
    again = [written.get(u, b"") for u in range(len(stored))]
    assert decided(resends._by_kernel, again, events, keep, window)[0] is not None


def test_memories_the_worker_writes_take_the_kernel():
    stored = [b"", b"e1 e2\np:5\n100 3", b"e1\np:3 q1:10\n100", b"e9\n\n100"]
    events = [(0, b"e1", None), (1, b"e2", None), (1, b"p-5", (b"p", 5)), (1, None, (b"p", 6)),
              (2, b"e7", (b"q1", 10)), (2, b"e8", (b"r", 1)), (3, b"e9", None)]  # fmt: skip
    events = [(*e, 110) for e in events]
    keep = np.ones(len(events), np.bool_)
    (memories, overflow), kept = decided(resends._by_kernel, stored, events, keep, ResendWindow())
    assert kept == [True, False, False, True, False, True, False]
    assert overflow == 0
    assert memories == {0: b"e1\n\n110", 1: b"e1 e2\np:6\n100 3",
                        2: b"e1 e8\np:3 q1:10 r:1\n100 10", 3: b"e9\n\n100"}  # fmt: skip


def test_a_memory_in_another_form_goes_to_memory_objects():
    keep = np.ones(1, np.bool_)
    slot, t = np.zeros(1, np.int64), np.array([50], np.int64)
    stored = [b"e1\np:007\n10"]  # leading zeros: not what the worker writes
    window = ResendWindow()
    assert resends._by_kernel(stored, slot, keep, [None], [(b"p", 7)], t, window) is None
    assert keep.tolist() == [True]  # untouched when the kernel declines
    found = resends.memories_after(stored, slot, keep, [None], [(b"p", 7)], t, window)
    assert found == ({0: b"e1\np:007\n10"}, 0)
    assert keep.tolist() == [False]


def test_ids_of_an_earlier_release_take_the_time_of_the_first_event_that_checks_them():
    keep = np.ones(2, np.bool_)
    stored = [b"e1 e2"]  # no times: an earlier release's count window
    events = [(0, b"e3", None, 500), (0, b"e1", None, 501)]
    (memories, _), kept = decided(resends.memories_after, stored, events, keep, ResendWindow())
    assert kept == [True, False] and memories == {0: b"e1 e2 e3\n\n500 0 0"}


def test_the_window_is_a_time_and_the_bound_counts_what_it_forgets_early():
    keep = np.ones(4, np.bool_)
    stored = [b"a b\n\n100 5"]  # a at 100, b at 105
    # at 131 a (100) is past a 30 s window and b is not; c and d then push b out early
    events = [(0, b"a", None, 131), (0, b"b", None, 131), (0, b"c", None, 132),
              (0, b"d", None, 133)]  # fmt: skip
    for way in (resends._by_kernel, resends.memories_by_object):
        (memories, overflow), kept = decided(way, stored, events, keep, ResendWindow(30, 2))
        assert kept == [True, False, True, True]
        assert memories == {0: b"c d\n\n132 1"} and overflow == 2  # b and a, within 30 s


def test_a_resend_a_day_later_is_still_a_resend_under_the_default_window():
    keep = np.ones(41, np.bool_)
    ids = [b"order-%d" % i for i in range(40)]
    stored = [b" ".join(ids) + b"\n\n1000" + b" 0" * 39]
    events = [(0, i, None, 1000 + 86_000) for i in ids] + [(0, b"new", None, 1000 + 86_401)]
    (memories, overflow), kept = decided(resends._by_kernel, stored, events, keep[:41],
                                         ResendWindow())  # fmt: skip
    assert kept == [False] * 40 + [True] and overflow == 0
    assert memories == {0: b"new\n\n87401"}  # the day-old ids expire as the new one comes


def test_a_batch_of_stamped_events_only():
    """publish()'s batches: every event stamped, no own ids; a resend of any size is dropped."""
    stamps = [(0, None, (b"p", s), 9) for s in (1, 2, 3)] + [(1, None, (b"q", 9), 9)]
    events = stamps + stamps  # the whole batch sent twice
    keep = np.ones(len(events), np.bool_)
    window = ResendWindow()
    found, kept = decided(resends._by_kernel, [b"", b"\nq:8"], events, keep, window)
    assert kept == [True] * 4 + [False] * 4
    assert found == ({0: b"\np:3", 1: b"\nq:9"}, 0)
    assert decided(resends.memories_by_object, [b"", b"\nq:8"], events, keep, window) == (
        found,
        kept,
    )
