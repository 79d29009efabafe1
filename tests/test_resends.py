"""The batch's resends found by the kernel (worker/engine/compute/resends.py) are the ones a
`Memory` per user finds (worker/common/dedup.py), with the same memories written back,
whatever the memories and events hold; and a memory the worker wrote takes the kernel."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.dedup import generated_event_id
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
WINDOW_IDS = st.lists(IDS | st.sampled_from([b"", b"\xfe"]), max_size=40).map(b" ".join)
MEMORY = st.one_of(
    st.just(b""),
    WINDOW_IDS,
    st.tuples(WINDOW_IDS, MARKS).map(lambda p: p[0] + b"\n" + p[1]),
)


@st.composite
def batches(draw):
    """Stored memories of a few users and a batch of their events, some resent."""
    users = draw(st.integers(1, 4))
    stored = [draw(MEMORY) for _ in range(users)]
    n = draw(st.integers(1, 40))
    events = []
    for _ in range(n):
        if events and draw(st.booleans()):
            events.append(draw(st.sampled_from(events)))  # a resend
            continue
        producer = draw(st.none() | PRODUCER)
        generated = producer is not None and draw(st.booleans())
        event_id = generated_event_id(producer) if generated else draw(st.none() | IDS)
        events.append((draw(st.integers(0, users - 1)), event_id, producer))
    keep = np.array([draw(st.booleans()) or draw(st.booleans()) for _ in range(n)])
    return stored, events, keep, draw(st.sampled_from([1, 2, 3, 32]))


def decided(way, stored, events, keep, window):
    keep = keep.copy()
    slot = np.array([e[0] for e in events], np.int64)
    ids, producers = [e[1] for e in events], [e[2] for e in events]
    return way(stored, slot, keep, ids, producers, window), keep.tolist()


@settings(max_examples=300, deadline=None)
@given(batches())
def test_the_kernel_decides_as_memory_objects_do(case):
    expected = decided(resends.memories_by_object, *case)
    assert decided(resends.memories_after, *case) == expected
    found = decided(resends._by_kernel, *case)
    if found[0] is not None:
        assert found == expected


def test_memories_the_worker_writes_take_the_kernel():
    stored = [b"", b"e1 e2\np:5", b"e1\np:3 q1:10", b"e9"]
    events = [(0, b"e1", None), (1, b"e2", None), (1, b"p-5", (b"p", 5)), (1, None, (b"p", 6)),
              (2, b"e7", (b"q1", 10)), (2, b"e8", (b"r", 1)), (3, b"e9", None)]  # fmt: skip
    keep = np.ones(len(events), np.bool_)
    memories, kept = decided(resends._by_kernel, stored, events, keep, 32)
    assert kept == [True, False, False, True, False, True, False]
    assert memories == {0: b"e1", 1: b"e1 e2\np:6", 2: b"e1 e8\np:3 q1:10 r:1", 3: b"e9"}


def test_a_memory_in_another_form_goes_to_memory_objects():
    keep = np.ones(1, np.bool_)
    slot = np.zeros(1, np.int64)
    stored = [b"e1\np:007"]  # leading zeros: not what the worker writes
    assert resends._by_kernel(stored, slot, keep, [None], [(b"p", 7)], 32) is None
    assert keep.tolist() == [True]  # untouched when the kernel declines
    assert resends.memories_after(stored, slot, keep, [None], [(b"p", 7)], 32) == {0: b"e1\np:007"}
    assert keep.tolist() == [False]


def test_the_window_keeps_the_last_ids():
    keep = np.ones(3, np.bool_)
    memories, kept = decided(resends._by_kernel, [b"a b"], [(0, b"c", None), (0, b"d", None),
                                                           (0, b"a", None)], keep, 3)  # fmt: skip
    assert memories == {0: b"c d a"} and kept == [True, True, True]


def test_a_batch_of_stamped_events_only():
    """publish()'s batches: every event stamped, no own ids; a resend of any size is dropped."""
    stamps = [(0, None, (b"p", s)) for s in (1, 2, 3)] + [(1, None, (b"q", 9))]
    events = stamps + stamps  # the whole batch sent twice
    keep = np.ones(len(events), np.bool_)
    memories, kept = decided(resends._by_kernel, [b"", b"\nq:8"], events, keep, 32)
    assert kept == [True] * 4 + [False] * 4
    assert memories == {0: b"\np:3", 1: b"\nq:9"}
    assert decided(resends.memories_by_object, [b"", b"\nq:8"], events, keep, 32) == (
        memories,
        kept,
    )
