"""Aligns a re-trace's blocks with the full trace's: same outputs, same order.

A block shared by ``g`` devices that splits its rows runs the function
re-traced at ``b / g`` rows (``passes.modes``). The re-trace is cut at the
same equations, but the order in which a block *exports* its values comes
from the order later blocks *read* them, and that order may change with the
batch size (Hugging Face's GPT-2 reads its attention mask at another place
when the batch has one row). Matching exports by position would then pair a
value with another one.

:func:`align_partition` pairs every export of a full-trace block with the
value the re-trace computes at the same place: the equations of the two
blocks are aligned (longest matching runs of primitives, as the automatic
cut aligns a re-trace), and an export defined by equation ``e``, output
``o`` corresponds to output ``o`` of the equation aligned with ``e`` (a
function output corresponds to the function output at the same position).
The re-trace's blocks are then rewritten with their exports, and their
inputs, in the full trace's order. A block whose exports cannot all be
paired keeps its own order and its act inputs read impossible positions, so
``passes.modes.local_block`` finds no match and the block runs replicated.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any

from tessel_jax import compat

from .partition import ForwardBlock, Partition, Source


def align_partition(full: Partition, local: Partition) -> Partition:
  """``local`` with every block's exports and inputs in ``full``'s order.

  Args:
    full: The partition of the function at the micro-batch's rows.
    local: The partition of the same function re-traced at fewer rows and
      cut at the same places.

  Returns:
    A partition like ``local`` whose block ``k`` exports, for every output
    position ``i`` of ``full.blocks[k]``, the re-trace's value computed at
    the same place, and reads its inputs in ``full.blocks[k]``'s order
    (where the blocks correspond; see the module docstring).
  """
  if len(full.blocks) != len(local.blocks):
    return local
  f_out = list(full.traced.closed_jaxpr.jaxpr.outvars)
  l_out = list(local.traced.closed_jaxpr.jaxpr.outvars)
  perms = [_export_perm(fb, lb, f_out, l_out)
           for fb, lb in zip(full.blocks, local.blocks)]
  # new_pos[k][local position] = full position (None: block k unaligned).
  new_pos = [None if p is None else {lp: i for i, lp in enumerate(p)}
             for p in perms]

  def remap(s: Source) -> Source:
    if s.kind != "act":
      return s
    table = new_pos[s.index]
    # An unaligned producer: a position no full block has, so never equal.
    out = -1 - s.output if table is None else table[s.output]
    return Source("act", s.index, out)

  blocks = tuple(_reorder(fb, lb, perm, remap)
                 for fb, lb, perm in zip(full.blocks, local.blocks, perms))
  epilogue = dataclasses.replace(
      local.epilogue,
      terminals=tuple(remap(t) for t in local.epilogue.terminals))
  return dataclasses.replace(local, blocks=blocks, epilogue=epilogue)


def _reorder(fb: ForwardBlock, lb: ForwardBlock,
             perm: Sequence[int] | None, remap: Any) -> ForwardBlock:
  """``lb`` with outputs in ``perm`` order and inputs in ``fb``'s order."""
  inputs = tuple(remap(s) for s in lb.inputs)
  order = list(range(len(inputs)))
  if len(set(inputs)) == len(inputs) and set(inputs) == set(fb.inputs):
    where = {s: j for j, s in enumerate(inputs)}
    order = [where[s] for s in fb.inputs]
  out_order = list(perm) if perm is not None else list(range(len(lb.outvars)))
  return dataclasses.replace(
      lb, inputs=tuple(inputs[j] for j in order),
      invars=tuple(lb.invars[j] for j in order),
      in_avals=tuple(lb.in_avals[j] for j in order),
      outvars=tuple(lb.outvars[j] for j in out_order),
      out_avals=tuple(lb.out_avals[j] for j in out_order))


def _export_perm(fb: ForwardBlock, lb: ForwardBlock, f_out: Sequence[Any],
                 l_out: Sequence[Any]) -> list[int] | None:
  """For each export of ``fb``, the position of its counterpart among
  ``lb``'s exports; None when some export has none (or two share one)."""
  if len(fb.outvars) != len(lb.outvars):
    return None
  eqn_map = _eqn_map(fb.eqns, lb.eqns)
  f_def = _definitions(fb.eqns)
  l_pos = {id(v): j for j, v in enumerate(lb.outvars)}
  perm = []
  for v in fb.outvars:
    lv = None
    if id(v) in f_def:
      e, o = f_def[id(v)]
      if e in eqn_map:
        lv = lb.eqns[eqn_map[e]].outvars[o]
    else:
      q = next((q for q, w in enumerate(f_out) if w is v), None)
      if q is not None and q < len(l_out):
        lv = l_out[q]
    if lv is None or id(lv) not in l_pos:
      return None
    perm.append(l_pos[id(lv)])
  if len(set(perm)) != len(perm):
    return None
  return perm


def _definitions(eqns: Sequence[Any]) -> dict[int, tuple[int, int]]:
  """``id(var)`` -> ``(equation index, output index)`` of its definition."""
  out = {}
  for e, eqn in enumerate(eqns):
    for o, v in enumerate(eqn.outvars):
      if not compat.is_dropvar(v):
        out[id(v)] = (e, o)
  return out


def _eqn_map(full: Sequence[Any], local: Sequence[Any]) -> dict[int, int]:
  """Full equation index -> the aligned local equation (same primitive)."""
  a = [compat.primitive_name(e) for e in full]
  b = [compat.primitive_name(e) for e in local]
  if a == b:
    return {i: i for i in range(len(a))}
  matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
  out = {}
  for tag, i1, i2, j1, _ in matcher.get_opcodes():
    if tag == "equal":
      for d in range(i2 - i1):
        out[i1 + d] = j1 + d
  return out
