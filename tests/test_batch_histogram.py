"""BatchHistogram (worker/engine/adapters/histograms.py): a few values counted one by one (an
array's or a list's) land in the buckets numpy's path gives them, le semantics included; the
tally's latencies (`ages`) are the same as a list for a few as an array for many."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from worker.engine.adapters.histograms import FEW_VALUES, BatchHistogram
from worker.engine.tally import ages

BOUNDS = (0.001, 0.005, 0.01, 0.1, 1.0)
VALUES = st.one_of(st.sampled_from([0.0, *BOUNDS, 2.0, -1.0]), st.floats(-1, 5))


@given(st.lists(st.lists(VALUES, min_size=1, max_size=FEW_VALUES), min_size=1, max_size=6))
def test_few_values_count_as_the_array_path_does(batches):
    h = BatchHistogram("a", "a", BOUNDS)
    for i, values in enumerate(batches):
        h.observe_many(np.asarray(values) if i % 2 else list(values))
    every = np.concatenate([np.asarray(v) for v in batches])
    want = np.bincount(np.searchsorted(np.asarray(BOUNDS), every, side="left"), minlength=6)
    assert h.bucket_counts().tolist() == want.tolist()
    assert np.isclose(h._sum, every.sum())


def test_a_value_on_a_bound_is_in_that_bound_s_bucket_and_nan_above_all():
    h = BatchHistogram("a", "a", BOUNDS)
    h.observe_many(np.asarray([0.005, 1.0, 1.5, float("nan")]))
    assert h.bucket_counts().tolist() == [0, 1, 0, 0, 1, 2]


@given(st.lists(st.floats(0, 2e12), min_size=0, max_size=3 * FEW_VALUES), st.floats(0, 2e9))
def test_ages_are_numpys_for_a_few_arrivals_and_many(arrivals_ms, now):
    arrival = np.asarray(arrivals_ms, np.float64)
    want = np.maximum(0.0, now - arrival / 1000.0)
    got = ages(now, arrival)
    assert isinstance(got, list) == (len(arrival) <= FEW_VALUES)
    assert np.array_equal(np.asarray(got, np.float64), want)
