"""``experiments.train --step_opt_level``: the pipelined step's XLA compile
options (off by default; XLA accepts the option it sets)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments import train_lib

_REPO = pathlib.Path(__file__).resolve().parents[1]


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
  """In a fresh process: ``experiments.train_args`` defines its flags on
  absl's global FLAGS, which other runners' modules imported by the suite
  (same flag names) would clash with here."""
  code = (
      "from absl import flags\n"
      "from experiments import train_args\n"
      "flags.FLAGS(['prog', '--step_opt_level=1', '--plot=', '--output='])\n"
      "print(train_args.from_flags().step_opt_level)\n"
      "flags.FLAGS.unparse_flags()\n"
      "flags.FLAGS(['prog', '--plot=', '--output='])\n"
      "print(train_args.from_flags().step_opt_level)\n")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", code], cwd=_REPO, env=env,
                        capture_output=True, text=True, check=False,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["1", "None"]
