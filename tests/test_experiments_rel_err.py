"""``experiments.rel_err.max_rel``: the experiments' one relative error."""

from __future__ import annotations

import numpy as np
import pytest

from experiments import rel_err


def test_max_rel_is_the_largest_leaf_ratio_in_float64():
  want = {"a": np.array([1.0, -4.0], np.float32), "b": np.array([10.0])}
  got = {"a": np.array([1.5, -4.0], np.float32), "b": np.array([10.1])}
  # a: 0.5 / 4 = 0.125; b: 0.1 / 10 = 0.01
  assert rel_err.max_rel(got, want) == pytest.approx(0.125, rel=1e-12)
  assert rel_err.max_rel(want, want) == 0.0
  assert rel_err.max_rel({}, {}) == 0.0


def test_max_rel_says_inf_for_a_shape_and_raises_for_a_structure():
  assert rel_err.max_rel(np.zeros(3), np.zeros(2)) == float("inf")
  with pytest.raises(ValueError, match="2 and 1 leaves"):
    rel_err.max_rel((np.zeros(1), np.zeros(1)), (np.zeros(1),))
