"""Where a lowered program's HLO sits: segment kinds and kernel copies.

``breakdown(built, text)`` splits the compiled HLO text of a
``tessel_jax`` program (``built.jitted.lower(...).compile().as_text()``)
into characters per segment kind (unrolled ticks, loop bodies, interpreted
ramps; ``hlo_count.segment_chars``) and counts how many copies of each
kernel body it holds: the kernel's ``dot``/``convolution`` instructions in
the module over those of one trace of the kernel (its jaxpr). Used by
``experiments.peer_bench`` and ``tests/test_kernel_copies.py``.
"""

from __future__ import annotations

from typing import Any

import jax

from experiments import hlo_count


def per_copy_heavy(built: Any) -> dict[int, int]:
  """Kernel id -> ``dot_general`` and ``conv`` equations of one trace."""
  layout = built.layout
  avals = layout.local_avals(built.partition.traced.param_avals)
  out = {}
  for kid, k in built.plan.kernels.items():
    pvals = [avals[l] for l in k.params]
    jaxpr = jax.make_jaxpr(lambda p, x, k=k: k.fn({"row_offset": 0}, p, x))(
        pvals, list(k.in_avals))
    text = str(jaxpr)
    out[kid] = text.count("dot_general[") + text.count(
        "conv_general_dilated[")
  return out


def breakdown(built: Any, text: str) -> dict[str, Any]:
  """Segment kchars, kernel copies (by label) and the plan's segments."""
  copies = hlo_count.kernel_copies(text, per_copy_heavy(built))
  labels = {kid: k.label for kid, k in built.plan.kernels.items()}
  return {"segments": built.plan.loop_summary(),
          "kchars_by_segment": {k: round(v / 1000, 1) for k, v in
                                hlo_count.segment_chars(text).items()},
          "kernel_copies": {labels[k]: c for k, c in copies.items()}}
