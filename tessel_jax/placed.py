"""Already-placed parameters: pack once, then step without packing.

A plain call ``step(params, batch)`` copies every parameter into the
per-device slot arrays and flat buffers of the layout (``passes.packing``)
and every gradient back out, each step: on a parameter-heavy model that is
a large share of the step. ``step.place(params)`` does the packing once and
returns a :class:`Placed`, a registered pytree of the per-device arrays,
already sharded on the mesh; ``step(placed, batch)`` runs the pipeline on it
directly, and in training returns the gradients as a :class:`Placed` of the
same layout, so elementwise optimisers (``optax.adam``, ``optax.sgd``, ...)
update it as they would the user's tree. ``step.unplace(placed)`` gives the
user's pytree back.

Every *site* of a leaf (a slot row, a flat region, the gathered full leaf)
holds the same value, and its gradient there is the leaf's whole gradient
(summed over every site, as ``pack_arrays.unpack_grads`` does), so copies of a
leaf used on several devices stay equal under any elementwise update.
Leaves stored at one site per device (the common case: a layer on one
device) need no sum and leave the program as computed. Leaves no block reads
are kept whole in ``Placed.rest`` (gradient zero).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

try:  # installed: passes/ is tessel_jax.passes
  from tessel_jax.passes import outputs as _outputs  # type: ignore
  from tessel_jax.passes import pack_arrays as _pack_arrays  # type: ignore
except ImportError:  # run from the repository root
  from passes import outputs as _outputs  # type: ignore
  from passes import pack_arrays as _pack_arrays  # type: ignore


@dataclasses.dataclass(frozen=True)
class PlacedKey:
  """Which step and build a :class:`Placed` belongs to (static pytree data).

  Attributes:
    token: The owning step's identity token (compared by identity).
    build_key: The step's cache key of the build (input shapes).
    batch_sig: Tree structure and leaf shapes of the batch of that build.
    fn_name: The step's function name, for messages.
  """

  token: Any
  build_key: Any
  batch_sig: Any
  fn_name: str


@dataclasses.dataclass(frozen=True, repr=False)
class Placed:
  """Parameters (or their gradients) in a step's per-device layout.

  Attributes:
    flat: Flat buffers ``(D, size)`` by dtype, split over the pipe axis.
    slots: Per slot class, its slot arrays ``(D, *shape)``.
    gathered: Pipe-sharded leaves read by blocks on a subset of the pipe
      axis, whole (sharded over the pipe axis).
    rest: Leaves no block reads, whole.
    key: The owning step and build (static).
  """

  flat: Mapping[str, Any]
  slots: tuple[tuple[Any, ...], ...]
  gathered: tuple[Any, ...]
  rest: tuple[Any, ...]
  key: PlacedKey

  def __repr__(self) -> str:
    n = len(jax.tree_util.tree_leaves(self))
    return (f"Placed({n} arrays for tessel_jax step"
            f" {self.key.fn_name!r})")


jax.tree_util.register_dataclass(
    Placed, data_fields=["flat", "slots", "gathered", "rest"],
    meta_fields=["key"])


@dataclasses.dataclass(frozen=True)
class Site:
  """One place a leaf is stored.

  Attributes:
    kind: ``"slot"``, ``"flat"``, ``"gathered"`` or ``"rest"``.
    device: Pipe device (-1: the whole leaf, gathered or rest).
    where: slot: ``(class, slot)``; flat: ``(dtype, offset, size)``;
      gathered / rest: ``(index,)``.
  """

  kind: str
  device: int
  where: tuple[Any, ...]


def leaf_sites(layout: Any, num_leaves: int) -> list[list[Site]]:
  """Every site of every stored leaf (a leaf with none goes to ``rest``)."""
  out: list[list[Site]] = [[] for _ in range(num_leaves)]
  for dt, d, l, pos, n in _pack_arrays.flat_pieces(layout):
    out[l].append(Site("flat", d, (dt, pos, n)))
  for (l, d), (k, j) in sorted(layout.slot_of.items()):
    out[l].append(Site("slot", d, (k, j)))
  for idx, l in enumerate(sorted(layout.gathered)):
    out[l].append(Site("gathered", -1, (idx,)))
  rest = [l for l in range(num_leaves) if not out[l]]
  for idx, l in enumerate(rest):
    out[l].append(Site("rest", -1, (idx,)))
  return out


def needs_sum(layout: Any, leaf: int, sites: Sequence[Site]) -> bool:
  """Whether ``leaf``'s gradient at its sites differs from the whole one:
  it has several sites on one device (or, unsharded, several at all), or a
  gathered site besides others."""
  if len(sites) <= 1:
    return False
  if any(s.kind == "gathered" for s in sites):
    return True
  if leaf not in layout.shards:
    return True
  devices = [s.device for s in sites]
  return len(devices) != len(set(devices))


class Layouts:
  """The placed form of one build: packs, reads and converts gradients.

  Args:
    built: The step's ``Built`` (its ``lowering`` and ``layout``).
    key: The :class:`PlacedKey` of this build.
  """

  def __init__(self, built: Any, key: PlacedKey):
    self.built = built
    self.key = key
    self.lowering = built.lowering
    self.layout = built.layout
    traced = built.partition.traced
    self.avals = list(traced.param_avals)
    self.local = self.layout.local_avals(self.avals)
    self.split = traced.leaf_split
    self.user_tree = (self.split.user_tree if self.split is not None
                      else traced.param_tree)
    self.sites = leaf_sites(self.layout, len(self.avals))
    self.rest = [l for l, s in enumerate(self.sites) if s[0].kind == "rest"]
    self.gathered = tuple(sorted(self.layout.gathered))

  # --- shardings ------------------------------------------------------------

  def shardings(self) -> Placed:
    """A :class:`Placed` of the ``NamedSharding`` of every array."""
    low = self.lowering
    mesh, pipe = low.mesh, low.pipe
    return Placed(
        flat={dt: NamedSharding(mesh, P(pipe)) for dt in self.layout.dtypes},
        slots=tuple(tuple(NamedSharding(mesh, P(pipe, *c.spec))
                          for _ in range(c.count))
                    for c in self.layout.classes),
        gathered=tuple(NamedSharding(mesh, low._shard_spec(l))  # pylint: disable=protected-access
                       for l in self.gathered),
        rest=tuple(NamedSharding(mesh, P()) for _ in self.rest),
        key=self.key)

  # --- user tree <-> placed ------------------------------------------------

  def pack(self, params: Any) -> Placed:
    """The user's params -> :class:`Placed` (traceable; jit it)."""
    leaves = jax.tree_util.tree_leaves(params)
    if self.split is not None:
      leaves = self.split.split(leaves)
    flat, slots = _pack_arrays.pack(self.layout, leaves)
    return Placed(flat=flat, slots=tuple(tuple(s) for s in slots),
                  gathered=tuple(leaves[l] for l in self.gathered),
                  rest=tuple(leaves[l] for l in self.rest), key=self.key)

  def _site_value(self, placed: Placed, leaf: int, site: Site) -> Any:
    if site.kind == "gathered":
      return placed.gathered[site.where[0]]
    if site.kind == "rest":
      return placed.rest[site.where[0]]
    if site.kind == "slot":
      k, j = site.where
      return placed.slots[k][j][site.device]
    dt, off, n = site.where
    row = jax.lax.slice(placed.flat[dt], (site.device, off),
                        (site.device + 1, off + n))
    return row.reshape(self.local[leaf].shape)

  def read_leaf(self, placed: Placed, leaf: int) -> Any:
    """One stored leaf from its first site (a sharded one: the devices'
    shards concatenated)."""
    sites = self.sites[leaf]
    whole = [s for s in sites if s.device < 0]
    if whole:
      return self._site_value(placed, leaf, whole[0])
    if leaf not in self.layout.shards:
      return self._site_value(placed, leaf, sites[0])
    ax, parts = self.layout.shards[leaf]
    first = {}
    for s in sites:
      first.setdefault(s.device, s)
    return jnp.concatenate([self._site_value(placed, leaf, first[d])
                            for d in range(parts)], axis=ax)

  def unpack(self, placed: Placed) -> Any:
    """:class:`Placed` -> the user's params (traceable; jit it)."""
    leaves = [self.read_leaf(placed, l).astype(a.dtype)
              for l, a in enumerate(self.avals)]
    if self.split is not None:
      leaves = self.split.merge(leaves)
    return jax.tree_util.tree_unflatten(self.user_tree, leaves)

  # --- gradients ------------------------------------------------------------

  def grads(self, gflat: Mapping[str, Any], gslots: Sequence[Any],
            hgrads: Sequence[Any]) -> Placed:
    """The program's raw gradients -> a :class:`Placed` whose every site
    holds its leaf's whole gradient (see the module docstring).

    ``gslots``: per class, its slot gradients stacked ``(D, S, *shape)``
    or (:meth:`_mapped`) a tuple of ``(D, *shape)`` per slot."""
    per_slot = all(isinstance(g, (tuple, list)) for g in gslots)
    slots = [list(g) if per_slot else [g[:, j] for j in range(c.count)]
             for g, c in zip(gslots, self.layout.classes)]
    flat = dict(gflat)
    gathered = list(hgrads)
    fix = [l for l, s in enumerate(self.sites)
           if needs_sum(self.layout, l, s)]
    if fix:
      stacked = [jnp.stack(g, axis=1) for g in slots] if per_slot else gslots
      whole = _pack_arrays.unpack_grads(self.layout, gflat, stacked, self.avals)
      for l, g in zip(self.gathered, hgrads):
        whole[l] = whole[l] + g.astype(whole[l].dtype)
      for l in fix:
        self._write_sites(l, whole[l], flat, slots, gathered)
    rest = tuple(jnp.zeros(self.avals[l].shape, self.avals[l].dtype)
                 for l in self.rest)
    return Placed(flat=flat, slots=tuple(tuple(s) for s in slots),
                  gathered=tuple(gathered), rest=rest, key=self.key)

  def _write_sites(self, leaf: int, g: Any, flat: dict[str, Any],
                   slots: list[list[Any]], gathered: list[Any]) -> None:
    """Writes the whole gradient ``g`` of ``leaf`` into each of its sites."""
    for s in self.sites[leaf]:
      if s.kind == "gathered":
        gathered[s.where[0]] = g
        continue
      local = _pack_arrays.local_leaf(self.layout, {leaf: g}, leaf, s.device)
      if s.kind == "slot":
        k, j = s.where
        slots[k][j] = slots[k][j].at[s.device].set(
            local.astype(slots[k][j].dtype))
      else:
        dt, off, n = s.where
        flat[dt] = flat[dt].at[s.device, off:off + n].set(
            jnp.ravel(local).astype(dt))

  # --- the program ----------------------------------------------------------

  @property
  def workspace(self) -> bool:
    """Whether the program takes and returns a workspace
    (``Switches.workspace``, training only)."""
    low = self.lowering
    return low.train and low.switches.workspace

  def workspace_sharding(self) -> Any:
    """Every workspace array's sharding: one slice per pipe device."""
    low = self.lowering
    return NamedSharding(low.mesh, P(low.pipe))

  def _mapped(self) -> Any:
    """The lowering's ``shard_map``; in training without FSDP slots, a
    copy of it whose slot gradients leave the map one array per slot, in
    the slots' own spec (the tree program stacks them per class for
    ``unpack_grads``: here that stack and its slices would be two copies
    of every gradient); with a workspace, one whose hoisted values leave
    the map too, last."""
    low = self.lowering
    if not low.train or not (self.layout.grads_per_slot or self.workspace):
      return low.smap
    in_specs, (fspec, sspec, hspec, tspec) = low.map_specs
    body = low.body
    if self.layout.grads_per_slot:
      low = copy.copy(low)
      low.per_slot_grads = True
      sspec = tuple(tuple(low._slot_spec(c) for _ in range(c.count))  # pylint: disable=protected-access
                    for c in self.layout.classes)
      body = low.body
    out_specs = (fspec, sspec, hspec, tspec)
    if self.workspace:
      out_specs += (P(low.pipe),)
      body = functools.partial(body, workspace=True)
    return jax.shard_map(body, mesh=low.mesh, in_specs=in_specs,
                         out_specs=out_specs,
                         axis_names={low.pipe, *low.data_axes},
                         check_vma=False)

  def program(self) -> Any:
    """``run(placed, batch)``: ``(value, Placed grads)`` or the outputs;
    with a workspace (:attr:`workspace`), ``run(placed, batch, ws)``:
    ``((value, Placed grads), ws)``, ``ws`` not read (only donated, so
    XLA writes the new one into its buffers)."""
    low = self.lowering
    outputs = _outputs.Outputs(low.part, low.per_mb, low.ks.terminal_avals,
                               low.total_n)
    smap = self._mapped()

    def run(placed: Placed, batch: Any) -> Any:
      b_leaves = tuple(jax.tree_util.tree_leaves(batch))
      slots = [list(s) for s in placed.slots]
      if not low.train:
        bufs = smap(dict(placed.flat), slots, placed.gathered, b_leaves)
        return outputs.infer([buf.sum(axis=0) for buf in bufs])
      gflat, gslots, hgrads, terms, *ws = smap(dict(placed.flat), slots,
                                               placed.gathered, b_leaves)
      value = outputs.train([t.sum(axis=0) for t in terms])
      out = value, self.grads(gflat, gslots, hgrads)
      return (out, ws[0]) if ws else out

    if self.workspace:
      return lambda placed, batch, ws: run(placed, batch)
    return run


def _pack_stored(layouts: Layouts, leaves: Sequence[Any]) -> Placed:
  """:meth:`Layouts.pack` from stored (already split) leaves."""
  flat, slots = _pack_arrays.pack(layouts.layout, list(leaves))
  return Placed(flat=flat, slots=tuple(tuple(s) for s in slots),
                gathered=tuple(leaves[l] for l in layouts.gathered),
                rest=tuple(leaves[l] for l in layouts.rest), key=layouts.key)


def expected(layouts: Layouts) -> Placed:
  """The :class:`Placed` of ``ShapeDtypeStruct`` this build takes."""
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in layouts.avals]
  return jax.eval_shape(lambda leaves: _pack_stored(layouts, leaves), avals)
