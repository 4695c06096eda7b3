"""``experiments.train --step_opt_level``: the pipelined step's XLA compile
options (off by default; XLA accepts the option it sets)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments import train_lib


def test_default_keeps_xla_defaults():
  assert train_lib.TrainArgs().step_opt_level is None
  assert train_lib.step_compile_options(None) is None


def test_level_is_an_option_xla_accepts():
  opts = train_lib.step_compile_options(1)
  assert opts == {"xla_backend_optimization_level": 1}
  f = jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0)
  x = np.arange(8, dtype=np.float32)
  compiled = f.lower(x).compile(opts)  # an unknown option raises here
  np.testing.assert_allclose(compiled(x), np.tanh(x) * 2 + 1, rtol=1e-6)


def test_flag_reaches_train_args():
  from absl import flags  # pylint: disable=import-outside-toplevel
  from experiments import train_args  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  was_parsed = f.is_parsed()
  try:
    f(["prog", "--step_opt_level=1", "--plot=", "--output="])
    assert train_args.from_flags().step_opt_level == 1
    f(["prog", "--plot=", "--output="])
    f["step_opt_level"].value = None  # absl keeps values between parses
    assert train_args.from_flags().step_opt_level is None
  finally:
    f.unparse_flags()
    if was_parsed:
      f(["prog"])
