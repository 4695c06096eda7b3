"""Scan split: cut a top-level ``lax.scan`` at iteration boundaries.

A layer stack written as one ``lax.scan`` over stacked parameters (penzai's
``use_layer_stack=True``, ``nnx.scan``, flax ``nn.scan``, MaxText's
``scan_layers``) is one top-level equation. This pass lets the automatic cut
(``passes.autocut``) treat it like unrolled layers: every iteration of a
top-level scan is one *unit* (costed as ``1 / length`` of the scan), the cut
chooses positions between units, and :func:`emit` rewrites each scan that a
cut falls inside into *sub-scans* over contiguous iteration ranges:

* every ``xs`` leaf (stacked parameters or stacked inputs) is sliced inside
  the program, right before the sub-scan that reads it, so the stacked
  parameter stays ONE leaf for the user and its gradient is the sum of the
  blocks' slice gradients (each lands in its own slice of the stacked leaf);
* the carry (the activation) flows from one sub-scan to the next, across the
  block boundary;
* the stacked ``ys`` outputs (residuals, per-layer aux) of the sub-scans are
  concatenated in iteration order after the last one;
* with ``autocut.cut_to(split_leaves=True)`` (what ``tj.schedule`` does
  without ``param_sharding``) a stacked parameter leaf that only sub-scans
  read, in slices tiling it, is stored as one leaf per slice
  (:func:`split_param_leaves`, :class:`LeafSplit`), so each device holds
  only its blocks' layers and their gradients.

Sub-scans keep the scan's body, so a ``jax.checkpoint`` (remat) body stays
remat'd. A scan that is the only equation of a top-level ``jax.checkpoint``
(``jax.checkpoint(lambda p, h: lax.scan(...))``) is a site too: each
sub-scan is wrapped in a checkpoint with the same ``prevent_cse`` and
``policy`` (:func:`hoist_remat_scans` first moves other equations out of such
a checkpoint). Scans inside nested ``jax.jit`` calls are top-level once
``compat.flatten_jaxpr`` has inlined the calls.

Markers: a ``tj.boundary`` called inside the body of a top-level scan (the
scan split happens before markers are counted, :func:`split_marked`) cuts the
stack after every iteration, as if the layers were unrolled with a boundary
between consecutive layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from tessel_jax import compat

from . import autocut_cost

MAX_LENGTH = 4096  # longer scans (e.g. loops over time steps) stay whole


@dataclasses.dataclass(frozen=True, eq=False)
class ScanSite:
  """A top-level scan the cut may split.

  Attributes:
    eqn: Index of the top-level equation (a scan, or a checkpoint whose only
      equation is a scan).
    scan: The scan equation itself.
    length: Iterations.
    num_consts: Leading loop-invariant inputs.
    num_carry: Carried inputs (and the first outputs).
    reverse: The scan runs its iterations last to first.
    remat: ``jax.checkpoint`` kwargs when the scan sits in a checkpoint.
    arg_map: With ``remat``: for each scan input, the checkpoint input it is
      (an int) or a literal's value.
  """

  eqn: int
  scan: Any
  length: int
  num_consts: int
  num_carry: int
  reverse: bool
  remat: dict[str, Any] | None = None
  arg_map: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Unit:
  """One cuttable unit: a whole equation, or iterations ``[lo, hi)`` (in
  ``xs`` index order) of a split scan."""

  eqn: int
  lo: int = 0
  hi: int = 0

  @property
  def is_iteration(self) -> bool:
    return self.hi > self.lo


def _site(index: int, eqn: Any) -> ScanSite | None:
  """The site of a top-level equation, or None when it is not one."""
  remat = compat.remat_info(eqn)
  scan, kwargs, arg_map = eqn, None, None
  if remat is not None:
    body, kwargs = remat
    inner = compat.jaxpr_eqns(body)
    invars, outvars = compat.jaxpr_io(body)
    if len(inner) != 1 or not compat.is_scan(inner[0]):
      return None
    scan = inner[0]
    if list(scan.outvars) != list(outvars):
      return None
    pos = {v: i for i, v in enumerate(invars)}
    try:
      arg_map = tuple(compat.literal_value(v) if compat.is_literal(v)
                      else pos[v] for v in scan.invars)
    except KeyError:
      return None
  elif not compat.is_scan(eqn):
    return None
  length, nc, ncar, reverse = compat.scan_layout(scan)
  if not 2 <= length <= MAX_LENGTH:
    return None
  return ScanSite(eqn=index, scan=scan, length=length, num_consts=nc,
                  num_carry=ncar, reverse=reverse, remat=kwargs,
                  arg_map=arg_map)


def _batch_dependent(closed: Any, num_params: int) -> set[Any]:
  """Top-level variables computed from the micro-batch (invars after the
  first ``num_params``)."""
  invars, _ = compat.jaxpr_io(closed)
  dep = set(invars[num_params:])
  for eqn in compat.jaxpr_eqns(closed):
    if any(isinstance(v, compat.Var) and v in dep for v in eqn.invars):
      dep.update(v for v in eqn.outvars if isinstance(v, compat.Var))
  return dep


def _over_layers(site: ScanSite, eqn: Any, batch_dep: set[Any]) -> bool:
  """True when some ``xs`` leaf does not depend on the micro-batch (stacked
  parameters): a stack of layers, not a loop over rows or time steps."""
  xs = _scan_inputs(site, eqn.invars)[site.num_consts + site.num_carry:]
  return any(isinstance(v, compat.Var) and v not in batch_dep for v in xs)


def sites(closed: Any, num_params: int | None = None) -> dict[int, ScanSite]:
  """Top-level equation index -> :class:`ScanSite`, for every splittable
  scan of ``closed`` (flattened: nested jit calls inlined).

  With ``num_params`` (the leading invars that are parameter leaves), only
  scans over layers qualify: some ``xs`` leaf must not depend on the
  micro-batch (a scan over the batch's rows or time steps stays whole, and
  so does a ``fori_loop`` without ``xs``).
  """
  batch_dep = (None if num_params is None
               else _batch_dependent(closed, num_params))
  out = {}
  for i, eqn in enumerate(compat.jaxpr_eqns(closed)):
    site = _site(i, eqn)
    if site is not None and (batch_dep is None
                             or _over_layers(site, eqn, batch_dep)):
      out[i] = site
  return out


def units(closed: Any, scan_sites: dict[int, ScanSite]) -> tuple[Unit, ...]:
  """The cuttable units in program (execution) order."""
  out = []
  for i in range(len(compat.jaxpr_eqns(closed))):
    site = scan_sites.get(i)
    if site is None:
      out.append(Unit(i))
      continue
    order = range(site.length - 1, -1, -1) if site.reverse else range(
        site.length)
    out.extend(Unit(i, t, t + 1) for t in order)
  return tuple(out)


def structure(closed: Any, unit_seq: Sequence[Unit]) -> tuple[str, ...]:
  """Primitive name of every unit (``"scan"`` for each iteration)."""
  eqns = compat.jaxpr_eqns(closed)
  return tuple("scan" if u.is_iteration else compat.primitive_name(eqns[u.eqn])
               for u in unit_seq)


def unit_costs(eqn_costs: Sequence[float], unit_seq: Sequence[Unit],
               scan_sites: dict[int, ScanSite]) -> np.ndarray:
  """Per-unit cost: an equation's own, or ``1 / length`` of its scan's."""
  c = np.asarray(eqn_costs, dtype=float)
  return np.array([c[u.eqn] / scan_sites[u.eqn].length if u.is_iteration
                   else c[u.eqn] for u in unit_seq])


def unit_live(eqn_live: Sequence[float], closed: Any,
              unit_seq: Sequence[Unit],
              scan_sites: dict[int, ScanSite]) -> np.ndarray:
  """Bytes live before every unit (and at the end).

  Between iterations ``k`` and ``k + 1`` of a scan: what is live before the
  scan, less its initial carry where the scan is that value's last reader,
  plus the carry and the ``ys`` of the first ``k`` iterations.
  """
  live = np.asarray(eqn_live, dtype=float)
  eqns = compat.jaxpr_eqns(closed)
  out = np.zeros(len(unit_seq) + 1)
  done = 0
  for u_idx, u in enumerate(unit_seq):
    first = u_idx == 0 or unit_seq[u_idx - 1].eqn != u.eqn
    done = 0 if first else done + 1
    if not u.is_iteration or first:
      out[u_idx] = live[u.eqn]
      continue
    out[u_idx] = _inner_live(live[u.eqn], closed, scan_sites[u.eqn],
                             done)
  out[-1] = live[len(eqns)]
  return out


def _inner_live(before: float, closed: Any, site: ScanSite,
                done: int) -> float:
  """Bytes live after ``done`` iterations of ``site`` (see unit_live)."""
  eqns = compat.jaxpr_eqns(closed)
  eqn = eqns[site.eqn]
  _, outvars = compat.jaxpr_io(closed)
  defined = {v for e in eqns[:site.eqn] for v in e.outvars}
  later = {v for e in eqns[site.eqn + 1:] for v in e.invars
           if not compat.is_literal(v)}
  later |= {v for v in outvars if not compat.is_literal(v)}
  inits = _scan_inputs(site, eqn.invars)[
      site.num_consts:site.num_consts + site.num_carry]
  dead = sum(autocut_cost.nbytes(v.aval) for v in
             {v for v in inits if isinstance(v, compat.Var)}
             if v in defined and v not in later)
  carry = sum(autocut_cost.nbytes(v.aval)
              for v in eqn.outvars[:site.num_carry])
  ys = sum(autocut_cost.nbytes(v.aval) for v in eqn.outvars[site.num_carry:])
  return before - dead + carry + ys * done / site.length


# --- emitting the split program -----------------------------------------------


def _scan_inputs(site: ScanSite, ins: Sequence[Any]) -> list[Any]:
  if site.arg_map is None:
    return list(ins)
  return [ins[j] if isinstance(j, int) else j for j in site.arg_map]


def _bind_chunk(site: ScanSite, ins: Sequence[Any], lo: int, hi: int,
                body: Any = None) -> list[Any]:
  """One sub-scan over iterations ``[lo, hi)`` (inputs in scan order).

  The ``xs`` are sliced first (outside any checkpoint, so the slices of a
  stacked parameter are visible to :func:`split_param_leaves`); the scan is
  wrapped in a checkpoint when the site is remat'd.
  """
  split = site.num_consts + site.num_carry
  xs = list(ins[split:])
  if (lo, hi) != (0, site.length):
    xs = [lax.slice_in_dim(x, lo, hi, axis=0) for x in xs]
  bind = lambda *a: compat.bind_scan(site.scan, a, hi - lo, body)
  if site.remat is not None:
    bind = jax.checkpoint(bind, **site.remat)
  return list(bind(*ins[:split], *xs))


def _split_scan(site: ScanSite, ins: Sequence[Any],
                chunks: Sequence[tuple[int, int]], cut_before: Sequence[bool],
                body: Any = None) -> list[Any]:
  """Sub-scans over ``chunks`` (execution order), boundaries between them.

  ``cut_before[k]``: bind an operand-less ``tessel_boundary`` before chunk
  ``k``. Returns the scan's outputs (final carry, concatenated ys).
  """
  scan_ins = _scan_inputs(site, ins)
  nc, ncar = site.num_consts, site.num_carry
  carry = scan_ins[nc:nc + ncar]
  pieces: list[tuple[int, list[Any]]] = []
  for (lo, hi), cut in zip(chunks, cut_before):
    if cut:
      compat.bind_boundary()
    outs = _bind_chunk(site, scan_ins[:nc] + carry + scan_ins[nc + ncar:],
                       lo, hi, body)
    carry = outs[:ncar]
    pieces.append((lo, outs[ncar:]))
  pieces.sort(key=lambda p: p[0])
  num_ys = len(pieces[0][1])
  ys = [pieces[0][1][j] if len(pieces) == 1 else
        lax.concatenate([p[1][j] for p in pieces], 0) for j in range(num_ys)]
  return list(carry) + ys


def emit(closed: Any, scan_sites: dict[int, ScanSite],
         unit_seq: Sequence[Unit], positions: Sequence[int],
         bodies: dict[int, Any] | None = None) -> Any:
  """``closed`` with an operand-less boundary before every unit position.

  A position inside a scan splits it into sub-scans (module docstring);
  scans with no position inside stay one equation.

  Args:
    closed: The flattened ClosedJaxpr the units were made from.
    scan_sites: From :func:`sites`.
    unit_seq: From :func:`units`.
    positions: Unit indices (``1..len(unit_seq) - 1``) starting new blocks.
    bodies: Optional replacement bodies for some scans (equation index ->
      ClosedJaxpr), used by :func:`split_marked`.

  Returns:
    A ClosedJaxpr with the same invars, constants and outputs.
  """
  cuts = set(int(p) for p in positions)
  bodies = bodies or {}
  span: dict[int, list[int]] = {}
  for u_idx, u in enumerate(unit_seq):
    span.setdefault(u.eqn, []).append(u_idx)

  def handler(i: int, eqn: Any, ins: list[Any]) -> list[Any] | None:
    idx = span[i]
    site = scan_sites.get(i)
    inner = [u for u in idx[1:] if u in cuts]
    if site is None or (not inner and i not in bodies):
      if idx[0] in cuts:
        compat.bind_boundary()
      return None
    chunks, cut_before = [], []
    start = idx[0]
    for u in idx[1:] + [idx[-1] + 1]:
      if u in cuts or u == idx[-1] + 1:
        group = [unit_seq[k] for k in range(start, u)]
        chunks.append((min(g.lo for g in group), max(g.hi for g in group)))
        cut_before.append(start in cuts)
        start = u
    return _split_scan(site, ins, chunks, cut_before, bodies.get(i))

  if not cuts and not bodies:
    return closed
  return compat.retrace(closed, handler)


# --- stacked parameter leaves stored as slices --------------------------------


@dataclasses.dataclass(frozen=True)
class LeafSplit:
  """Stacked parameter leaves the lowering stores as row slices.

  After a scan is split, each block reads its own rows of a stacked leaf.
  Handing the lowering one leaf per slice (instead of the whole stack to
  every block) lets each device hold only its blocks' layers and their
  gradients, as for unrolled layers; :meth:`split` and :meth:`merge` convert
  at the program's edge, so the user still passes and gets one leaf.

  Attributes:
    user_tree: The user's parameter tree structure.
    ranges: Per user leaf, the row ranges of its pieces in order (tiling
      the leaf's axis 0), or ``()`` for a leaf kept whole.
  """

  user_tree: Any
  ranges: tuple[tuple[tuple[int, int], ...], ...]

  def split(self, leaves: Sequence[Any]) -> list[Any]:
    """User leaves -> stored leaves (pieces in place of split leaves)."""
    out: list[Any] = []
    for x, rows in zip(leaves, self.ranges):
      out.extend([lax.slice_in_dim(x, lo, hi, axis=0) for lo, hi in rows]
                 if rows else [x])
    return out

  def merge(self, leaves: Sequence[Any]) -> list[Any]:
    """Stored leaves (e.g. gradients) -> user leaves (pieces concatenated)."""
    it = iter(leaves)
    return [lax.concatenate([next(it) for _ in rows], 0) if rows else next(it)
            for rows in self.ranges]

  def avals(self, user_avals: Sequence[Any]) -> tuple[Any, ...]:
    """Shapes of the stored leaves."""
    out = []
    for a, rows in zip(user_avals, self.ranges):
      out.extend([jax.ShapeDtypeStruct((hi - lo,) + tuple(a.shape[1:]),
                                       a.dtype) for lo, hi in rows]
                 if rows else [a])
    return tuple(out)

  def wrap(self, program: Any, train: bool) -> Any:
    """``program(stored params, batch)`` as ``fn(user params, batch)``."""

    def run(params: Any, batch: Any) -> Any:
      out = program(tuple(self.split(jax.tree_util.tree_leaves(params))),
                    batch)
      if not train:
        return out
      value, grads = out
      return value, jax.tree_util.tree_unflatten(
          self.user_tree, self.merge(jax.tree_util.tree_leaves(grads)))

    return run


def _uses(closed: Any) -> dict[Any, list[Any]]:
  uses: dict[Any, list[Any]] = {}
  for eqn in compat.jaxpr_eqns(closed):
    for v in eqn.invars:
      if isinstance(v, compat.Var):
        uses.setdefault(v, []).append(eqn)
  return uses


def _leaf_pieces(v: Any, uses: dict[Any, list[Any]]
                 ) -> list[tuple[tuple[int, int], Any]] | None:
  """``[((lo, hi), slice eqn)]`` tiling ``v``'s rows when every reader of
  ``v`` is a row slice feeding only scans (sub-scans); else None."""
  readers = uses.get(v, [])
  pieces = []
  for eqn in readers:
    rows = compat.slice_rows(eqn)
    out = eqn.outvars[0]
    if rows is None or not isinstance(out, compat.Var) or not uses.get(
        out) or not all(compat.is_scan(e) or compat.remat_info(e) is not None
                        for e in uses[out]):
      return None
    pieces.append((rows, eqn))
  pieces.sort(key=lambda p: p[0])
  bounds = [r for r, _ in pieces]
  if len(bounds) < 2 or bounds[0][0] != 0 or bounds[-1][1] != v.aval.shape[0]:
    return None
  if any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])):
    return None
  return pieces


def split_param_leaves(closed: Any, num_params: int, user_tree: Any
                       ) -> tuple[Any, LeafSplit | None]:
  """Stacked parameter leaves read only through sub-scans' row slices
  become one jaxpr input per slice (the slices' own variables).

  Args:
    closed: A cut ClosedJaxpr (after :func:`emit`); its first
      ``num_params`` invars are the parameter leaves.
    num_params: Parameter leaves.
    user_tree: The user's parameter tree structure.

  Returns:
    ``(closed, None)`` when no leaf qualifies, else the jaxpr whose
    parameter invars are the stored leaves and the :class:`LeafSplit`.
  """
  invars, outvars = compat.jaxpr_io(closed)
  returned = {v for v in outvars if isinstance(v, compat.Var)}
  uses = _uses(closed)
  new_invars, ranges, drop = [], [], []
  for v in invars[:num_params]:
    pieces = None if v in returned else _leaf_pieces(v, uses)
    if pieces is None:
      new_invars.append(v)
      ranges.append(())
      continue
    new_invars.extend(eqn.outvars[0] for _, eqn in pieces)
    drop.extend(eqn for _, eqn in pieces)
    ranges.append(tuple(r for r, _ in pieces))
  if not drop:
    return closed, None
  out = compat.with_invars(closed, new_invars + invars[num_params:], drop)
  return out, LeafSplit(user_tree=user_tree, ranges=tuple(ranges))


# --- checkpoint(scan) and markers inside a scanned body -----------------------


def _remat_scan_to_hoist(eqn: Any) -> tuple[Any, dict[str, Any]] | None:
  """A top-level checkpoint whose body holds a long scan among other
  equations (a single scan is already a site)."""
  info = compat.remat_info(eqn)
  if info is None:
    return None
  inner = compat.jaxpr_eqns(info[0])
  if len(inner) < 2 or not any(
      compat.is_scan(e) and 2 <= compat.scan_layout(e)[0] <= MAX_LENGTH
      for e in inner):
    return None
  return info


def hoist_remat_scans(closed: Any) -> Any:
  """Inlines every top-level checkpoint that holds a scan, re-wrapping
  each equation of its body in its own checkpoint (same ``prevent_cse`` and
  ``policy``), so each scan becomes a checkpoint of that scan alone: a
  site. The values are unchanged (remat changes what is stored, not what
  is computed)."""
  eqns = compat.jaxpr_eqns(closed)
  found = {i: info for i, e in enumerate(eqns)
           if (info := _remat_scan_to_hoist(e)) is not None}
  if not found:
    return closed

  def handler(i: int, eqn: Any, ins: list[Any]) -> list[Any] | None:
    del eqn
    if i not in found:
      return None
    body, kwargs = found[i]
    invars, outvars = compat.jaxpr_io(body)
    env = dict(zip(invars, ins))

    def read(v: Any) -> Any:
      return compat.literal_value(v) if compat.is_literal(v) else env[v]

    for inner in compat.jaxpr_eqns(body):
      args = [read(v) for v in inner.invars]
      outs = jax.checkpoint(lambda *a, e=inner: compat.bind_eqn(e, a),
                            **kwargs)(*args)
      for v, x in zip(inner.outvars, outs):
        if not compat.is_dropvar(v):
          env[v] = x
    return [read(v) for v in outvars]

  return compat.retrace(closed, handler)


def _has_boundary(body: Any) -> bool:
  return any(compat.is_boundary(e) for e in compat.jaxpr_eqns(body))


def marked_scans(closed: Any) -> list[int]:
  """Top-level scans whose body calls ``tj.boundary`` at its top level."""
  return [i for i, e in enumerate(compat.jaxpr_eqns(closed))
          if compat.is_scan(e) and _has_boundary(compat.scan_body(e))]


def split_marked(closed: Any) -> Any:
  """Every scan with a ``tj.boundary`` in its body cut after each iteration.

  The boundary is removed from the body; the scan becomes one sub-scan per
  iteration with a boundary between consecutive ones (the stack behaves as
  unrolled layers with a ``tj.boundary`` between layers). Other scans and
  equations are unchanged.
  """
  marked = marked_scans(closed)
  if not marked:
    return closed
  all_sites = sites(closed)
  scan_sites = {}
  for i in marked:
    site = all_sites.get(i) or _forced_site(i, compat.jaxpr_eqns(closed)[i])
    scan_sites[i] = site
  unit_seq = units(closed, scan_sites)
  positions = [k for k, u in enumerate(unit_seq)
               if k and u.is_iteration and unit_seq[k - 1].eqn == u.eqn]
  bodies = {i: compat.flatten_jaxpr(compat.scan_body(
      compat.jaxpr_eqns(closed)[i]), drop_boundaries=True) for i in marked}
  return emit(closed, scan_sites, unit_seq, positions, bodies)


def _forced_site(index: int, eqn: Any) -> ScanSite:
  length, nc, ncar, reverse = compat.scan_layout(eqn)
  return ScanSite(eqn=index, scan=eqn, length=length, num_consts=nc,
                  num_carry=ncar, reverse=reverse)


__all__ = ["LeafSplit", "MAX_LENGTH", "ScanSite", "Unit", "emit",
           "hoist_remat_scans", "split_param_leaves",
           "marked_scans", "sites", "split_marked", "structure", "unit_costs",
           "unit_live", "units"]
