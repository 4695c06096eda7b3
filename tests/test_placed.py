"""Already-placed parameters: ``step.place``, ``step(placed, batch)``,
``step.unplace`` and ``step.train_step`` (``tessel_jax.placed``).

Every placed program is checked against ``jax.value_and_grad`` of the plain
function; an elementwise optimiser on the placed tree must give what it
gives on the user's tree, including for leaves stored at several sites (a
tied embedding read on every device, a sharded table gathered onto a
subset).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import tessel_jax as tj
from experiments import lowering_bench_lib as lb
from tessel_jax import placed as placed_lib
from tessel_jax import placements

from test_lowering_models import max_rel_err, reference
from test_sharded_params import _batch as gpt_batch
from test_sharded_params import _leaf
from test_sharded_params import _params as gpt_params
from test_sharded_params import gpt_fn

HIDDEN = 16
ROWS = 8


def _mlp(n: int = 4, **kw):
  fn, params = lb.chain_model(2, HIDDEN, 2)
  batch = lb.make_batch(n * ROWS, HIDDEN)
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=n, cut="markers", **kw)
  return fn, params, batch, step


def _check_step(step, fn, params, batch, n):
  """The placed call equals value_and_grad; grads come back placed."""
  placed = step.place(params, batch)
  assert isinstance(placed, placed_lib.Placed)
  loss, grads = step(placed, batch)
  assert isinstance(grads, placed_lib.Placed)
  assert (jax.tree_util.tree_structure(grads) ==
          jax.tree_util.tree_structure(placed))
  want_loss, want_grads = reference(fn, params, batch, n)
  assert max_rel_err(loss, want_loss) <= 1e-5
  assert max_rel_err(step.unplace(grads), want_grads) <= 1e-5
  back = step.unplace(placed)
  for a, b in zip(jax.tree_util.tree_leaves(back),
                  jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  return placed, grads


def _adam_matches(step, params, batch, steps=2):
  """optax.adam on the placed tree == on the user's tree (1e-6)."""
  optax = pytest.importorskip("optax")
  opt = optax.adam(1e-2)
  tree, tstate = params, opt.init(params)
  placed = step.place(params, batch)
  pstate = opt.init(placed)
  for _ in range(steps):
    _, g = step(tree, batch)
    u, tstate = opt.update(g, tstate, tree)
    tree = optax.apply_updates(tree, u)
    _, pg = step(placed, batch)
    pu, pstate = opt.update(pg, pstate, placed)
    placed = optax.apply_updates(placed, pu)
  got = step.unplace(placed)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(tree)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6,
                               rtol=1e-6)
  return placed, tree


@pytest.fixture(scope="module")
def called_mlp():
  """One 4-micro-batch MLP step shared by the tests that call it before
  placing (built and compiled once; each test places its own arrays)."""
  return _mlp()


def test_mlp_placed_equals_value_and_grad_and_adam(called_mlp):
  fn, params, batch, step = called_mlp
  placed, grads = _check_step(step, fn, params, batch, 4)
  # The placed arrays are the layout's, sharded over the pipe axis.
  layout = step.built.layout
  assert layout.classes
  for c, arrays in zip(layout.classes, placed.slots):
    assert len(arrays) == c.count
    for a in arrays:
      assert a.shape == (2,) + c.shape
      assert a.sharding.spec[0] == "pipe"
  # Each leaf sits at one site: its gradient leaves the program as computed
  # (no unpack, no pack in the placed program).
  assert not any(placed_lib.needs_sum(layout, l, s)
                 for l, s in enumerate(placed_lib.leaf_sites(
                     layout, len(jax.tree_util.tree_leaves(params)))))
  _adam_matches(step, params, batch)
  # The plain tree keeps working alongside.
  loss, _ = step(params, batch)
  np.testing.assert_allclose(loss, step(placed, batch)[0], rtol=1e-6)


def test_train_step_donates_and_matches_adam(called_mlp):
  optax = pytest.importorskip("optax")
  fn, params, batch, step = called_mlp
  del fn
  opt = optax.adam(1e-2)
  train = step.train_step(opt)
  step(params, batch)
  placed = step.place(params)
  state = opt.init(placed)
  tree, tstate = params, opt.init(params)
  for _ in range(2):
    old = placed.slots[0][0]
    loss, placed, state = train(placed, state, batch)
    assert old.is_deleted()  # donated
    tloss, g = step(tree, batch)
    u, tstate = opt.update(g, tstate, tree)
    tree = optax.apply_updates(tree, u)
    np.testing.assert_allclose(loss, tloss, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(step.unplace(placed)),
                  jax.tree_util.tree_leaves(tree)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6,
                               rtol=1e-6)


@pytest.mark.parametrize("layout", ["auto", "flat"])
def test_tied_embedding_on_every_device_keeps_copies_equal(layout):
  """mshape(4), tied table: F0 on all devices and the head on device 3 read
  ``wte``; every site's gradient is the whole gradient, so adam keeps the
  copies equal."""
  fn = gpt_fn(separate_head_block=False)
  n = 4
  params, batch = gpt_params(4), gpt_batch(n * 8)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.mshape(4),
                     num_microbatches=n, param_layout=layout)
  placed, grads = _check_step(step, fn, params, batch, n)
  lay = step.built.layout
  sites = placed_lib.leaf_sites(lay, len(jax.tree_util.tree_leaves(params)))
  wte = _leaf(params, "wte")
  assert len(sites[wte]) > 1
  full = np.asarray(step.unplace(grads)["wte"])
  layouts = placed_lib.Layouts(step.built, grads.key)
  for s in sites[wte]:
    np.testing.assert_allclose(
        np.asarray(layouts._site_value(grads, wte, s)), full, rtol=1e-6)  # pylint: disable=protected-access
  placed, _ = _adam_matches(step, params, batch, steps=1)


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_sharded_table_gathered_onto_a_subset(mode):
  fn = gpt_fn(separate_head_block=False)
  n = 4
  params, batch = gpt_params(4), gpt_batch(n * 8)
  mesh = jax.make_mesh((4,), ("pipe",), devices=jax.devices()[:4])
  step = tj.schedule(fn, mesh=mesh,
                     placement=tj.placements.mshape(4, mode),
                     num_microbatches=n, mode=mode,
                     param_sharding={"wte": P("pipe", None), "layers": None})
  if mode == "infer":
    placed = step.place(params, batch)
    got = step(placed, batch)
    want = jnp.stack([fn(params, jax.tree_util.tree_map(
        lambda x, m=m: x[m * 8:(m + 1) * 8], batch)) for m in range(n)])
    assert max_rel_err(got, want) <= 1e-5
    return
  _check_step(step, fn, params, batch, n)
  assert step.built.layout.gathered
  _adam_matches(step, params, batch, steps=1)


def test_scanned_stack_and_data_axis():
  """A scanned layer stack (stored as per-block slices) on a pipe x data
  mesh: place splits the stack, unplace re-stacks it."""
  from test_scan_split import _batch, _params, scanned  # pylint: disable=import-outside-toplevel
  n = 4
  fn = scanned("plain")
  params, batch = _params(), _batch(4 * n)
  mesh = jax.make_mesh((2, 2), ("pipe", "data"), devices=jax.devices()[:4])
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=n, cut="auto", data_axes=("data",))
  _check_step(step, fn, params, batch, n)
  assert step.built.partition.traced.leaf_split is not None


def test_bad_placed_inputs_name_the_fix():
  fn, params, batch, step = _mlp()
  with pytest.raises(tj.TesselError, match="call the step"):
    step.place(params)
  placed = step.place(params, batch)
  _, _, _, other = _mlp()
  other.place(params, batch)
  with pytest.raises(tj.TesselError, match="placed by another tessel_jax"):
    other(placed, batch)
  with pytest.raises(tj.TesselError, match="batch differs"):
    step(placed, lb.make_batch(8 * ROWS, HIDDEN))
  bad = jax.tree_util.tree_map(lambda x: x, placed)
  bad = placed_lib.Placed(flat=bad.flat, slots=((bad.slots[0][0][:, :1],)
                                                + bad.slots[0][1:],)
                          + bad.slots[1:], gathered=bad.gathered,
                          rest=bad.rest, key=bad.key)
  with pytest.raises(tj.TesselError, match="keep the shapes"):
    step(bad, batch)
  with pytest.raises(tj.TesselError, match="already placed"):
    step.place(placed)
  with pytest.raises(tj.TesselError, match="unplace takes"):
    step.unplace(params)
  del fn


@pytest.mark.parametrize("mesh_shape,fsdp", [
    ({"pipe": 2, "model": 2}, False),          # Megatron split, GSPMD
    ({"pipe": 2, "data": 2, "model": 2}, True)])  # FSDP x tensor x pipe
def test_split_and_fsdp_leaves(mesh_shape, fsdp):
  """Slot classes split over GSPMD (and data) axes: placed with their
  spec, gradients placed the same way, equal to value_and_grad."""
  from test_fsdp import DATA_MODEL, _specs  # pylint: disable=import-outside-toplevel
  from test_tensor_parallel import _batch as tp_batch  # pylint: disable=import-outside-toplevel
  from test_tensor_parallel import _mesh as tp_mesh  # pylint: disable=import-outside-toplevel
  from test_tensor_parallel import _put, mlp_model  # pylint: disable=import-outside-toplevel
  params, specs, fn = mlp_model()
  if fsdp:
    specs = _specs(DATA_MODEL)
  mesh = tp_mesh(mesh_shape)
  n = 2
  batch = tp_batch(4 * n, False)
  step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                     num_microbatches=n, plan="1f1b",
                     data_axes=("data",) if fsdp else ())
  placed = step.place(_put(params, specs, mesh), batch)
  layout = step.built.layout
  assert any(c.spec for c in layout.classes)
  assert any(c.fsdp for c in layout.classes) == fsdp
  loss, grads = step(placed, batch)
  for a, g in zip(jax.tree_util.tree_leaves(placed),
                  jax.tree_util.tree_leaves(grads)):
    assert a.sharding.is_equivalent_to(g.sharding, a.ndim)
  want_loss, want_grads = reference(fn, params, batch, n)
  assert max_rel_err(loss, want_loss) <= 1e-5
  assert max_rel_err(step.unplace(grads), want_grads) <= 1e-5
