"""Classic pipeline schedules in the Schedule IR, for like-for-like comparison.

Every baseline is a function ``(graph, num_microbatches) -> UnrolledSchedule``
with ``status="BASELINE"``, ``source`` set to its registry name and
``period=None``. Each one fixes an order of actions per device; the times come
from :func:`tessel_jax.schedule.schedule_in_device_order` (ASAP, keeping every
device's order), so dependencies, edge delays, device exclusivity and
in-order micro-batches hold by construction.

Baselines (registry name: function, placements it fits):

* ``gpipe``: :func:`gpipe`, any placement. All forward blocks of all
  micro-batches, then all backward blocks, stage by stage.
* ``1f1b``: :func:`one_f_one_b`, any training placement: the classic
  PipeDream-flush / Megatron 1F1B on V-shape chains (one single-device stage
  per device), and on other placements (``mshape``, ``interleaved``,
  ``xshape``, ...) 1F1B over the stage list (forward blocks in topological
  order), as PyTorch runs it for any list of stages: a block shared by
  several devices is a stage on each of them.
* ``interleaved_1f1b``: :func:`interleaved_1f1b`, ``interleaved`` placements
  with >= 2 chunks. Megatron's interleaved 1F1B.
* ``chimera``: :func:`chimera`, ``xshape``. Two opposite pipelines merged per
  device (see the function for the variant).
* ``zb_h1``: :func:`zb_h1`, ``vshape`` with ``split_backward=True``. ZB-H1 of
  the zero-bubble paper (Qi et al., 2023): 1F1B with each ``W`` deferred by
  the stage index, at 1F1B's peak memory (the maximum over devices).

* ``dualpipev``: :func:`dualpipev`, ``zbv`` placements (V shape, two stages
  per device, split backward). DeepSeek's DualPipeV (the DualPipe
  repository's ``dualpipev.py``), its eight phases per rank; ``N >= 2D``.
* ``zbv``: :func:`zbv_baseline`, ``zbv`` placements. ZB-V of the zero-bubble
  paper (the greedy of its repository), memory capped at 1F1B's peak.

The families live in ``baseline_1f1b`` (gpipe, 1f1b, interleaved_1f1b),
``baseline_zero_bubble`` (zb_h1, dualpipev, zbv) and ``baseline_chimera``;
``baseline_fits`` says which placements each fits, ``baseline_orders`` holds
their shared pieces. Every name is importable from here.

With a split backward, the baselines that do not place ``W`` themselves run
each ``W`` right after its ``B`` (fused backward).

No jax, no ortools here.
"""

from __future__ import annotations

from collections.abc import Callable

from tessel_jax.graph import BlockGraph
from tessel_jax.schedule import UnrolledSchedule
from tessel_jax.search.baseline_1f1b import (gpipe, interleaved_1f1b,
                                             one_f_one_b)
from tessel_jax.search.baseline_chimera import chimera
from tessel_jax.search.baseline_fits import for_placement
from tessel_jax.search.baseline_orders import Key
from tessel_jax.search.baseline_zero_bubble import (dualpipev, zb_h1,
                                                    zbv_baseline)

__all__ = ["ALIASES", "BASELINES", "Key", "canonical_name", "chimera",
           "dualpipev", "for_placement", "gpipe", "interleaved_1f1b",
           "one_f_one_b", "run", "zb_h1", "zbv_baseline"]


# --- registry -----------------------------------------------------------------

BASELINES: dict[str, Callable[[BlockGraph, int], UnrolledSchedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "chimera": chimera,
    "zb_h1": zb_h1,
    "dualpipev": dualpipev,
    "zbv": zbv_baseline,
}


# Other names accepted by :func:`run` (and ``tj.schedule(plan=...)``).
ALIASES: dict[str, str] = {
    "interleaved": "interleaved_1f1b",
    "zb": "zb_h1",
    "dualpipe_v": "dualpipev",
    "zb_v": "zbv",
}


def canonical_name(name: str) -> str:
  """The registry name of baseline ``name`` or of its alias (any case)."""
  if not isinstance(name, str):
    return name
  return ALIASES.get(name.lower(), name.lower())


def run(name: str, graph: BlockGraph,
        num_microbatches: int) -> UnrolledSchedule:
  """Runs baseline ``name`` (a key of :data:`BASELINES`) on ``graph``.

  Raises:
    ValueError: for an unknown name or a placement the baseline does not fit.
  """
  try:
    fn = BASELINES[canonical_name(name)]
  except (KeyError, TypeError):
    aliases = ", ".join(f"{a} ({t})" for a, t in ALIASES.items())
    raise ValueError(
        f"unknown baseline {name!r}; valid names are"
        f" {', '.join(BASELINES)} (aliases: {aliases})") from None
  return fn(graph, num_microbatches)
