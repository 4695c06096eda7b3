"""experiments.step_floor: the zero-work programs and the shuffled timer."""

from __future__ import annotations

import jax
import numpy as np

from experiments import step_floor_lib as lib


def test_leaf_programs_do_what_they_stand_for():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("pipe",))
  runs = lib.leaf_programs(mesh, (1, 3))
  assert sorted(runs) == [(1, "jit_zeros"), (1, "ppermute_each"),
                          (3, "jit_zeros"), (3, "ppermute_each")]
  zeros = runs[(3, "jit_zeros")]()
  assert len(zeros) == 3 and all(not np.any(z) for z in zeros)
  moved = runs[(3, "ppermute_each")]()   # replicated ones, permuted: ones
  assert len(moved) == 3 and all(np.all(np.asarray(m) == 1) for m in moved)
  ms = lib.time_shuffled(runs, rounds=2)
  assert set(ms) == set(runs) and all(v > 0 for v in ms.values())
