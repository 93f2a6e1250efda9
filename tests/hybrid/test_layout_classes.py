"""Merging interchangeable transition classes keeps every candidate-to-candidate transition exactly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid.stage_costs import merge_equivalent


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_merged_classes_keep_every_transition(groups: int, copies: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.choice([0.0, 0.5, 1.5], size=(groups, groups))
    # each group appears `copies` times as separate classes (e.g. layouts differing only in ep)
    of_class = np.repeat(np.arange(groups), copies)
    trans = base[np.ix_(of_class, of_class)]
    if rng.random() < 0.5:  # sometimes break a copy's symmetry: it must then stay a class of its own
        trans = trans.copy()
        trans[0, -1] += 1.0
    cls = rng.integers(0, trans.shape[0], size=12)
    new_cls, new_trans = merge_equivalent(cls, trans)
    assert new_trans.shape[0] <= trans.shape[0]
    np.testing.assert_array_equal(new_trans[np.ix_(new_cls, new_cls)], trans[np.ix_(cls, cls)])
    if not np.any(trans != base[np.ix_(of_class, of_class)]):
        assert new_trans.shape[0] <= groups  # identical copies collapse
