"""Inference reads the parameters in place: no per-call packing.

The inference program takes the parameters replicated on every device; its
kernels read them there. Packing them into per-device buffers (as training
does, for its gradient accumulators) copied every parameter on every call
(``concatenate`` + ``all-to-all`` of the packed buffers in the HLO, before
``passes.pack_local``; per-device stacked buffers after it).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

import tessel_jax as tj

TOL = 1e-5
VOCAB, HIDDEN = 64, 32


def _fn(params, batch):
  h = params["wte"][batch["tokens"]]
  h = h + jnp.tanh(h @ params["layers"][0])
  h = tj.boundary(h)                         # vshape(2): 2 forward blocks
  h = h + jnp.tanh(h @ params["layers"][1])
  return (h @ params["wte"].T).sum(axis=1)   # tied head


def _params():
  k = jax.random.split(jax.random.key(0), 3)
  return {"wte": jax.random.normal(k[0], (VOCAB, HIDDEN)) * 0.1,
          "layers": [jax.random.normal(k[i], (HIDDEN, HIDDEN)) * 0.1
                     for i in (1, 2)]}


def _stacked(hlo: str) -> list[str]:
  """Instructions whose f32 result is a per-device stack of a parameter
  (``(1 or 2, *leaf shape)``, transposes included): the packed layout's
  slot and region buffers, which in-place reads never build."""
  leaves = {(VOCAB, HIDDEN), (HIDDEN, VOCAB), (HIDDEN, HIDDEN)}
  out = []
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%\S+ = \(?f32\[([\d,]*)\]", line)
    if not m or not m.group(1):
      continue
    dims = tuple(int(d) for d in m.group(1).split(","))
    if len(dims) == 3 and dims[0] in (1, 2) and dims[1:] in leaves:
      out.append(line.strip()[:120])
  return out


def _step(mode: str, n: int = 4):
  # vshape(2): 2 + 2 blocks with uneven leaves per device (the flat layout,
  # which packs with a concatenate per device).
  rows = 2 * n
  tokens = jax.random.randint(jax.random.key(1), (rows, 5), 0, VOCAB)
  batch = {"tokens": tokens}
  mesh = jax.make_mesh((2,), ("pipe",))
  fn = _fn if mode == "infer" else lambda p, b: _fn(p, b).mean()
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=n, mode=mode, solver_time_limit_s=10.0)
  return step, _params(), batch


def test_vshape_inference_packs_nothing_and_matches():
  step, params, batch = _step("infer")
  hlo = step.lower(params, batch).compile().as_text()
  assert not _stacked(hlo), _stacked(hlo)
  assert "all-to-all" not in hlo
  out = step(params, batch)
  want = _fn(params, batch)
  np.testing.assert_allclose(out, want, rtol=TOL, atol=TOL)


def test_training_still_stacks_parameters():
  # The check above can fail: the training program of the same model holds
  # per-device stacked parameter buffers (its gradient accumulators need
  # the layout).
  step, params, batch = _step("train")
  hlo = step.lower(params, batch).compile().as_text()
  assert _stacked(hlo)
