"""A step's placed-parameter calls: ``place``, ``step(placed, batch)``,
``unplace`` and the fused, donating ``train_step`` (``tessel_jax.placed``).

Each build of a step (one set of input shapes) gets its own jitted packer,
program and unpacker, made on first use. A :class:`~tessel_jax.placed.Placed`
remembers its step and build; handing it to another step, with a batch of
other shapes, or after changing its arrays' shapes is refused with a message
saying how to place the parameters for that call.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tessel_jax import placed as _placed
from tessel_jax.placed import Placed, PlacedKey


@dataclasses.dataclass
class _Entry:
  """Jitted conversions and program of one build."""

  layouts: _placed.Layouts
  pack: Callable[[Any], Placed]
  unpack: Callable[[Placed], Any]
  run: Any  # jitted program
  raw: Callable[..., Any]  # the program, not jitted (for fused steps)
  expected: Placed
  fused: dict[Any, Any] = dataclasses.field(default_factory=dict)
  workspace: Any = None  # the hoisted values' buffers (Switches.workspace)
  grad_workspace: Any = None  # train_step's gradient buffers (the same)


class _State:
  """Per step: its identity token and the entries of its builds."""

  def __init__(self) -> None:
    self.token = object()
    self.entries: dict[Any, _Entry] = {}


_STATES: "weakref.WeakKeyDictionary[Any, _State]" = weakref.WeakKeyDictionary()


def _state(step: Any) -> _State:
  st = _STATES.get(step)
  if st is None:
    st = _STATES[step] = _State()
  return st


def _build_key(step: Any, built: Any) -> Any:
  return next(k for k, v in step._cache.items() if v is built)  # pylint: disable=protected-access


def _entry(step: Any, key: Any, built: Any) -> _Entry:
  st = _state(step)
  if key in st.entries:
    return st.entries[key]
  if built.lowering is None:
    raise step._error("this build has no lowering to run placed parameters"  # pylint: disable=protected-access
                      " on; call the step with the parameter tree instead")
  n = key[0].num_leaves
  pkey = PlacedKey(token=st.token, build_key=key,
                   batch_sig=(key[2], tuple(key[1][n:])),
                   fn_name=step.fn_name)
  lay = _placed.Layouts(built, pkey)
  shardings = lay.shardings()
  raw = lay.program()
  low = built.lowering
  out = ((NamedSharding(low.mesh, P()), shardings) if low.train else None)
  if lay.workspace:  # the workspace (argument 2) donated, written in place
    run = jax.jit(raw, out_shardings=(out, lay.workspace_sharding()),
                  donate_argnums=2, keep_unused=True)
  else:
    run = jax.jit(raw, out_shardings=out)
  entry = _Entry(layouts=lay,
                 pack=jax.jit(lay.pack, out_shardings=shardings),
                 unpack=jax.jit(lay.unpack), run=run,
                 raw=raw, expected=_placed.expected(lay))
  st.entries[key] = entry
  return entry


def _signature(tree: Any) -> tuple[Any, tuple[Any, ...]]:
  return (jax.tree_util.tree_structure(tree),
          tuple((tuple(x.shape), str(x.dtype))
                for x in jax.tree_util.tree_leaves(tree)))


def place(step: Any, params: Any, batch: Any = None) -> Placed:
  """``params`` packed once into ``step``'s per-device layout.

  Without ``batch`` the last build is used (the step must have been called
  or lowered once, with params of these shapes).
  """
  if isinstance(params, Placed):
    raise step._error("step.place got parameters that are already placed;"  # pylint: disable=protected-access
                      " pass them to the step as they are")
  if batch is not None:
    built = step.build(params, batch)
    key = _build_key(step, built)
  else:
    built = step.built
    key = _build_key(step, built)
    n = key[0].num_leaves
    if _signature(params) != (key[0], tuple(key[1][:n])):
      raise step._error(  # pylint: disable=protected-access
          "step.place(params): the parameters differ in structure or shapes"
          " from those of the step's last build; pass a batch too,"
          " step.place(params, batch), to build for them")
  return _entry(step, key, built).pack(params)


def _checked(step: Any, placed: Placed, what: str) -> _Entry:
  """The entry of ``placed``'s build after checking that it is ``step``'s
  and still has the layout's shapes."""
  st = _state(step)
  name = step.fn_name
  if placed.key.token is not st.token:
    raise step._error(  # pylint: disable=protected-access
        f"{what} got parameters placed by another tessel_jax step"
        f" ({placed.key.fn_name!r}); each step has its own layout: place"
        f" them with this one, step.place(other_step.unplace(placed))")
  entry = st.entries.get(placed.key.build_key)
  if entry is None:
    raise step._error(f"{what}: the build these parameters were placed for"  # pylint: disable=protected-access
                      f" is gone; place them again with step.place(params)")
  want_tree = jax.tree_util.tree_structure(entry.expected)
  got = _signature(placed)
  if got[0] != want_tree:
    raise step._error(f"{what}: the placed tree's structure differs from"  # pylint: disable=protected-access
                      f" the layout of {name!r}; make it with step.place")
  want = _signature(entry.expected)[1]
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_leaves_with_path(placed)]
  for path, g, w in zip(paths, got[1], want):
    if g != w:
      raise step._error(  # pylint: disable=protected-access
          f"{what}: placed array {path} has shape {g[0]} and dtype {g[1]}"
          f" but the layout stores {w[0]} {w[1]} there; the placed tree"
          f" must keep the shapes step.place gave it (update it"
          f" elementwise, or unplace, change and place again)")
  return entry


def check_batch(step: Any, placed: Placed, batch: Any) -> None:
  """Refuses a batch of other shapes than the placed parameters' build."""
  if _signature(batch) != placed.key.batch_sig:
    raise step._error(  # pylint: disable=protected-access
        "the batch differs in structure or shapes from the batch the"
        " parameters were placed for; place them for this batch:"
        " step.place(step.unplace(placed), batch)")


def _zeros(shapes: Any, shardings: Any) -> Any:
  """Zero arrays of ``shapes`` (a tree of ``ShapeDtypeStruct``) placed on
  ``shardings`` (a tree prefix)."""
  return jax.jit(lambda: jax.tree_util.tree_map(
      lambda s: jax.numpy.zeros(s.shape, s.dtype), shapes),
                 out_shardings=shardings)()


def _workspace(entry: _Entry, placed: Placed, batch: Any) -> Any:
  """The entry's hoisted values' buffers, made (zeros) on first use."""
  if entry.workspace is None:
    shapes = jax.eval_shape(entry.raw, placed, batch, None)[1]
    entry.workspace = _zeros(shapes, entry.layouts.workspace_sharding())
  return entry.workspace


def _grad_workspace(entry: _Entry, placed: Placed, batch: Any) -> Any:
  """Buffers for the fused train step's gradients, made on first use."""
  if entry.grad_workspace is None:
    shapes = jax.eval_shape(entry.raw, placed, batch, None)[0][1]
    entry.grad_workspace = _zeros(shapes, entry.layouts.shardings())
  return entry.grad_workspace


def call(step: Any, placed: Placed, batch: Any) -> Any:
  """``step(placed, batch)``: the program on already-placed parameters
  (with ``Switches.workspace``: the step's workspace donated and the new
  one kept)."""
  entry = _checked(step, placed, "step(placed, batch)")
  check_batch(step, placed, batch)
  step._last = entry.layouts.built  # pylint: disable=protected-access
  if not entry.layouts.workspace:
    return entry.run(placed, batch)
  ws = _workspace(entry, placed, batch)
  entry.workspace = None  # donated: gone if the call fails
  out, entry.workspace = entry.run(placed, batch, ws)
  return out


def lower(step: Any, placed: Placed, batch: Any) -> Any:
  """``jax.stages.Lowered`` of ``step(placed, batch)`` (with
  ``Switches.workspace``: of ``run(placed, batch, ws) -> (out, ws)``,
  ``ws`` donated, as ``step(placed, batch)`` calls it)."""
  entry = _checked(step, placed, "step.lower(placed, batch)")
  check_batch(step, placed, batch)
  if entry.layouts.workspace:
    return entry.run.lower(placed, batch, _workspace(entry, placed, batch))
  return entry.run.lower(placed, batch)


def unplace(step: Any, placed: Placed) -> Any:
  """The user's parameter tree from ``placed`` (or placed gradients)."""
  if not isinstance(placed, Placed):
    raise step._error(f"step.unplace takes what step.place returned, got a"  # pylint: disable=protected-access
                      f" {type(placed).__name__}")
  return _checked(step, placed, "step.unplace").unpack(placed)


def train_step(step: Any, optimizer: Any) -> Callable[..., Any]:
  """``f(placed, opt_state, batch) -> (value, placed, opt_state)``: the
  step, ``optimizer.update`` and the update added to the parameters, in one
  program that donates ``placed`` and ``opt_state`` (their buffers are
  reused for the results: do not use the arguments after the call).

  ``optimizer`` is an optax ``GradientTransformation`` (anything with
  ``update(grads, state, params) -> (updates, state)``); make its state
  with ``optimizer.init(placed)``.
  """
  if not hasattr(optimizer, "update"):
    raise step._error(f"train_step needs an optax-style optimiser with"  # pylint: disable=protected-access
                      f" update(grads, state, params); got"
                      f" {type(optimizer).__name__}")
  if step.mode != "train":
    raise step._error("train_step needs mode='train'")  # pylint: disable=protected-access

  def run(placed: Placed, opt_state: Any, batch: Any) -> Any:
    if not isinstance(placed, Placed):
      raise step._error("train_step takes placed parameters:"  # pylint: disable=protected-access
                        " placed = step.place(params)")
    entry = _checked(step, placed, "train_step")
    check_batch(step, placed, batch)
    hit = entry.fused.get(id(optimizer))
    if hit is None or hit[0] is not optimizer:
      hit = entry.fused[id(optimizer)] = (optimizer, _fused(entry, optimizer))
    if not entry.layouts.workspace:
      return hit[1](placed, opt_state, batch)
    ws = (_workspace(entry, placed, batch),
          _grad_workspace(entry, placed, batch))
    entry.workspace = entry.grad_workspace = None  # donated
    out, (entry.workspace, entry.grad_workspace) = hit[1](
        placed, opt_state, batch, ws)
    return out

  return run


def _fused(entry: _Entry, optimizer: Any) -> Any:
  """The jitted, donating step + update of one build (with
  ``Switches.workspace``: ``f(placed, opt_state, batch, ws) -> (out, ws)``,
  the workspace, hoisted values and gradients, donated too)."""
  def update(placed: Placed, opt_state: Any, value: Any, grads: Any) -> Any:
    updates, opt_state = optimizer.update(grads, opt_state, placed)
    new = jax.tree_util.tree_map(lambda p, u: (p + u).astype(p.dtype),
                                 placed, updates)
    return value, new, opt_state

  if not entry.layouts.workspace:
    return jax.jit(lambda placed, opt_state, batch: update(
        placed, opt_state, *entry.raw(placed, batch)), donate_argnums=(0, 1))

  def fused_ws(placed: Placed, opt_state: Any, batch: Any, ws: Any) -> Any:
    # ws: (hoisted values, gradients): the gradients, which the update
    # alone reads, leave the program too, into the last call's buffers.
    out, hoisted = entry.raw(placed, batch, ws[0])
    return update(placed, opt_state, *out), (hoisted, out[1])

  return jax.jit(fused_ws, donate_argnums=(0, 1, 3), keep_unused=True)
