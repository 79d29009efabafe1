"""The AUC's ranks (model/training/evaluate.py, without scipy.stats) are scipy.stats.rankdata's:
ties averaged, all NaN when a score is; and the AUC on cases worked by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import rankdata

from model.training.evaluate import average_ranks, roc_auc

# few distinct values: most draws hold ties; NaN and the infinities now and then
SCORES = st.lists(st.sampled_from([0.0, -0.0, 0.1, 0.5, 0.5000001, 1.0, -np.inf, np.inf])
                  | st.floats(allow_nan=False) | st.just(np.nan), max_size=60)  # fmt: skip


@given(SCORES)
def test_the_ranks_are_scipys(scores):
    np.testing.assert_array_equal(average_ranks(np.array(scores)), rankdata(scores))


def test_the_auc_on_cases_worked_by_hand():
    y = np.array([False, True, False, True])
    assert roc_auc(y, np.array([0.1, 0.9, 0.2, 0.8])) == 1.0
    assert roc_auc(y, np.array([0.9, 0.1, 0.8, 0.2])) == 0.0
    assert roc_auc(y, np.array([0.5, 0.5, 0.5, 0.5])) == 0.5  # ties count half
    assert roc_auc(y, np.array([0.1, 0.5, 0.5, 0.9])) == 0.875  # one positive ties a negative
    assert np.isnan(roc_auc(np.array([True, True]), np.array([0.1, 0.2])))  # one class
