"""Tests for the named placements (tessel_jax.placements)."""

import itertools

import pytest

from tessel_jax import placements
from tessel_jax.graph import Block, BlockGraph, PlacementError

DEVICE_COUNTS = (2, 4, 8)


def _all(d):
  return tuple(range(d))


def _chain(start, count):
  return {(i, i + 1) for i in range(start, start + count - 1)}


# Independent restatement of the shapes: name -> D -> (forward devices,
# forward edges, indices of forward blocks that have a gradient).
def _spec(name, d):
  one = [(i,) for i in range(d)]
  everything = list(range(2 * d + 2))
  if name == "vshape":
    return one, _chain(0, d), range(d)
  if name == "interleaved":
    return [(s % d,) for s in range(2 * d)], _chain(0, 2 * d), range(2 * d)
  if name == "xshape":
    devs = one + [(d - 1 - i,) for i in range(d)]
    return devs, _chain(0, d) | _chain(d, d), range(2 * d)
  if name == "mshape":
    return [_all(d)] + one, _chain(0, d + 1), range(d + 1)
  if name == "kshape":
    h = d // 2
    edges = _chain(0, h) | _chain(h, h) | {(h - 1, d), (d - 1, d)}
    return one + [_all(d)], edges, range(d + 1)
  if name in ("nnshape", "nnshape_eager"):
    return (one + [_all(d)] + one + [_all(d)], _chain(0, 2 * d + 2),
            everything)
  if name == "mllm":
    return [_all(d)] + one + [_all(d)], _chain(0, d + 2), range(d + 2)
  if name == "finetune":
    return [_all(d)] + one, _chain(0, d + 1), range(1, d + 1)
  if name == "alphafold":
    return one * 3, _chain(0, 3 * d), range(2 * d, 3 * d)
  if name == "zbv":
    devs = [(s if s < d else 2 * d - 1 - s,) for s in range(2 * d)]
    return devs, _chain(0, 2 * d), range(2 * d)
  raise AssertionError(f"no spec for {name}")


def test_registry_lists_every_placement():
  assert set(placements.PLACEMENTS) == {
      "vshape", "interleaved", "xshape", "mshape", "kshape", "nnshape",
      "nnshape_eager", "mllm", "finetune", "alphafold", "zbv"}


CASES = list(itertools.product(sorted(placements.PLACEMENTS), DEVICE_COUNTS,
                               ("train", "infer"), (False, True)))


@pytest.mark.parametrize("name,d,mode,split", CASES)
def test_builds_with_expected_blocks(name, d, mode, split):
  g = placements.get(name, d, mode=mode, split_backward=split)
  assert isinstance(g, BlockGraph)
  assert g.name == f"{name}.{mode}.d{d}"
  assert g.num_devices == d
  devices, fwd_edges, grads = _spec(name, d)
  grads = set(grads)
  nf = len(devices)
  forwards = [b for b in g.blocks if b.kind == "F"]
  assert [b.id for b in forwards] == list(range(nf))
  assert [b.devices for b in forwards] == [tuple(x) for x in devices]
  assert {(e.src, e.dst) for e in g.edges
          if e.src < nf and e.dst < nf} == fwd_edges
  backs = [b for b in g.blocks if b.kind == "B"]
  weights = [b for b in g.blocks if b.kind == "W"]
  if mode == "infer":
    assert not backs and not weights
    assert g.is_inference
    return
  assert {placements.forward_index(b) for b in backs} == grads
  # zbv splits its backward by default; the flag here is always explicit.
  assert {placements.forward_index(b) for b in weights} == (
      grads if split else set())
  for b in backs + weights:
    assert b.devices == g.block(placements.forward_index(b)).devices
  # Memory: +1 per F (+2 split) released by B (and W); frozen / eager 0.
  for f in forwards:
    if f.id not in grads:
      assert f.memory == 0
  for b in backs + weights:
    i = placements.forward_index(b)
    assert b.memory in (-1, 0)
    assert g.block(i).memory == -b.memory * (2 if split else 1)


@pytest.mark.parametrize("name,d,mode,split", CASES)
def test_json_round_trip(name, d, mode, split):
  g = placements.get(name, d, mode=mode, split_backward=split)
  back = BlockGraph.from_json(g.to_json())
  assert back == g
  assert back.to_json() == g.to_json()


@pytest.mark.parametrize("name", sorted(placements.PLACEMENTS))
@pytest.mark.parametrize("split", (False, True))
def test_naming_convention(name, split):
  g = placements.get(name, 4, split_backward=split)
  forwards = [b for b in g.blocks if b.kind == "F"]
  backs = [b for b in g.blocks if b.kind == "B"]
  weights = [b for b in g.blocks if b.kind == "W"]
  nf = len(forwards)
  for b in forwards:
    assert b.name == f"F{b.id}"
    assert placements.forward_index(b) == b.id
  # Forward ids are a topological order of the forward DAG.
  for e in g.edges:
    if e.src < nf and e.dst < nf:
      assert e.src < e.dst
  # B ids follow in reverse forward order, then W ids in the same order.
  fwd_of_b = [placements.forward_index(b) for b in backs]
  assert [b.id for b in backs] == list(range(nf, nf + len(backs)))
  assert fwd_of_b == sorted(fwd_of_b, reverse=True)
  assert [b.name for b in backs] == [f"B{i}" for i in fwd_of_b]
  assert [b.id for b in weights] == list(
      range(nf + len(backs), nf + len(backs) + len(weights)))
  assert [placements.forward_index(w) for w in weights] == (
      fwd_of_b if weights else [])
  owner = placements.backward_of(g)
  assert set(owner) == {b.id for b in backs + weights}
  for block_id, fwd in owner.items():
    index = placements.forward_index(g.block(block_id))
    assert g.block(fwd).name == f"F{index}"


@pytest.mark.parametrize("name", sorted(placements.PLACEMENTS))
def test_backward_edges_mirror_forward_edges(name):
  g = placements.get(name, 4, split_backward=True)
  b_of = {}
  w_of = {}
  for block_id, fwd in placements.backward_of(g).items():
    (b_of if g.block(block_id).kind == "B" else w_of)[fwd] = block_id
  nf = sum(b.kind == "F" for b in g.blocks)
  edges = {(e.src, e.dst) for e in g.edges}
  fwd_edges = {(s, t) for s, t in edges if s < nf and t < nf}
  grad_edges = {(s, t) for s, t in fwd_edges if s in b_of and t in b_of}
  assert {(s, t) for s, t in edges
          if s in b_of.values() and t in b_of.values()} == {
              (b_of[t], b_of[s]) for s, t in grad_edges}
  # Forward blocks with a gradient but no such successor feed their own B.
  sinks = {i for i in b_of if not any(s == i for s, _ in grad_edges)}
  assert {(s, t) for s, t in edges if s < nf and t >= nf} == {
      (i, b_of[i]) for i in sinks}
  # Each W depends on its B only, and nothing depends on a W.
  for i, w in w_of.items():
    assert {s for s, t in edges if t == w} == {b_of[i]}
    assert not any(s == w for s, _ in edges)


def test_vshape_matches_1f1b_placement():
  g = placements.vshape(4)
  assert [(b.name, b.devices, b.span, b.memory) for b in g.blocks] == [
      ("F0", (0,), 1, 1), ("F1", (1,), 1, 1), ("F2", (2,), 1, 1),
      ("F3", (3,), 1, 1), ("B3", (3,), 3, -1), ("B2", (2,), 3, -1),
      ("B1", (1,), 3, -1), ("B0", (0,), 3, -1)]
  assert {(e.src, e.dst) for e in g.edges} == {
      (0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)}


def test_split_backward_memory_and_spans():
  g = placements.vshape(2, f_span=2, b_span=3, split_backward=True, w_span=4)
  assert [(b.name, b.span, b.memory) for b in g.blocks] == [
      ("F0", 2, 2), ("F1", 2, 2), ("B1", 3, -1), ("B0", 3, -1),
      ("W1", 4, -1), ("W0", 4, -1)]
  # B chain does not wait for W: B1 -> B0 directly.
  assert (2, 3) in {(e.src, e.dst) for e in g.edges}


def test_interleaved_chunks_and_name():
  g = placements.interleaved(4, chunks=3)
  assert g.name == "interleaved_c3.train.d4"
  forwards = [b for b in g.blocks if b.kind == "F"]
  assert [b.devices[0] for b in forwards] == [s % 4 for s in range(12)]
  one = placements.interleaved(4, chunks=1)
  assert one.blocks == placements.vshape(4).blocks


def test_nnshape_eager_differs_only_in_all_device_blocks():
  d = 4
  plain = placements.nnshape(d)
  eager = placements.nnshape_eager(d)
  assert len(plain.blocks) == len(eager.blocks)
  assert plain.edges == eager.edges
  all_ids = {d, 2 * d + 1}
  for a, b in zip(plain.blocks, eager.blocks):
    assert (a.id, a.kind, a.name, a.devices) == (b.id, b.kind, b.name,
                                                 b.devices)
    index = placements.forward_index(a)
    if index in all_ids:
      assert b.memory == 0
      assert a.memory != 0
      assert b.span == (a.span + 1 if a.kind == "B" else a.span)
    else:
      assert (a.span, a.memory) == (b.span, b.memory)
  free = placements.nnshape_eager(d, recompute_span=0)
  assert [b.span for b in free.blocks] == [b.span for b in plain.blocks]
  assert placements.nnshape_eager(d, mode="infer").blocks == (
      placements.nnshape(d, mode="infer").blocks)


def test_finetune_frozen_block():
  g = placements.finetune(4)
  f0 = g.block(0)
  assert f0.devices == (0, 1, 2, 3) and f0.memory == 0
  assert "B0" not in {b.name for b in g.blocks}
  assert {b.span for b in g.blocks if b.kind == "B"} == {2}


def test_alphafold_recycling_passes():
  d = 4
  g = placements.alphafold(d)
  assert all(g.block(i).memory == 0 for i in range(2 * d))
  assert all(g.block(i).memory == 1 for i in range(2 * d, 3 * d))
  assert sorted(placements.forward_index(b) for b in g.blocks
                if b.kind == "B") == list(range(2 * d, 3 * d))


def test_zbv_splits_backward_by_default():
  g = placements.zbv(4)
  assert sum(b.kind == "W" for b in g.blocks) == 8
  assert [g.block(s).devices for s in range(8)] == [
      (0,), (1,), (2,), (3,), (3,), (2,), (1,), (0,)]
  unsplit = placements.zbv(4, split_backward=False)
  assert not any(b.kind == "W" for b in unsplit.blocks)


@pytest.mark.parametrize("name", sorted(placements.PLACEMENTS))
def test_docstring_has_picture(name):
  doc = placements.PLACEMENTS[name].__doc__
  assert "dev0" in doc and "dev3" in doc


def test_kshape_odd_devices_is_rejected():
  with pytest.raises(PlacementError, match=r"even number of devices"):
    placements.kshape(3)
  with pytest.raises(PlacementError, match=r"2, 4, 6, 8"):
    placements.get("kshape", 5)


@pytest.mark.parametrize("bad", (0, -1, 2.5, True, "4"))
def test_bad_device_counts_are_rejected(bad):
  with pytest.raises(PlacementError, match="num_devices"):
    placements.vshape(bad)


def test_bad_arguments_are_rejected():
  with pytest.raises(PlacementError, match="mode"):
    placements.vshape(4, mode="eval")
  with pytest.raises(PlacementError, match="b_span"):
    placements.xshape(4, b_span=0)
  with pytest.raises(PlacementError, match="chunks"):
    placements.interleaved(4, chunks=0)
  with pytest.raises(PlacementError, match="recompute_span"):
    placements.nnshape_eager(4, recompute_span=-1)


def test_get_unknown_name_lists_valid_names():
  with pytest.raises(PlacementError, match="valid names are") as info:
    placements.get("wshape", 4)
  for name in placements.PLACEMENTS:
    assert name in str(info.value)
  with pytest.raises(PlacementError, match="chunks"):
    placements.get("vshape", 4, chunks=2)


def test_single_device_placements_build():
  for name in placements.PLACEMENTS:
    if name == "kshape":
      continue
    g = placements.get(name, 1)
    assert g.num_devices == 1


def test_forward_index_rejects_bad_names():
  bad = BlockGraph(name="x", num_devices=1,
                   blocks=(Block(0, "F", 1, 0, (0,), "fwd"),))
  with pytest.raises(PlacementError, match="convention"):
    placements.forward_index(bad.block(0))
  with pytest.raises(PlacementError, match="convention"):
    placements.backward_of(bad)
