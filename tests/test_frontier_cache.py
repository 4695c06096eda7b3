"""The priced frontier on disk: a new process (here: a new FrontierFunction
with the per-process memo cleared) reads it back instead of pricing."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import pytest

from tessel_jax import frontier_cache as FC
from tessel_jax import plans as P

import test_lowering_models as M

KINDS = ["embed", "mixed", "layer", "head"]


def _frontier(unit="ms"):
  plans = (P.PricedPlan(candidate=P.Candidate("vshape", 2, 1, 4),
                        step=12.5, unit=unit, peak_bytes_per_device=(300, 200),
                        source="tessel", blocks=4, build_seconds=1.5),
           P.PricedPlan(candidate=P.Candidate("mshape", 2, 1, 4, "1f1b",
                                              memory_limit=4096),
                        step=10.0, unit=unit, peak_bytes_per_device=(500, 100),
                        source="1f1b", blocks=4, build_seconds=0.0,
                        screened=True))
  return P.ProgramFrontier(fn_name="f", plans=plans, pareto=P.pareto(plans),
                           skipped=(("xshape pipe2", "does not fit"),),
                           seconds=3.0)


def test_frontier_json_round_trip():
  fr = _frontier()
  back = P.ProgramFrontier.from_dict(json.loads(json.dumps(fr.to_dict())))
  assert back == fr
  assert back.choose(400) == fr.choose(400)


@pytest.fixture(name="priced")
def _priced(monkeypatch):
  """Counts the pricings; each returns the hand-made frontier."""
  calls = []

  def price(self, params, batch, markers, t0):
    calls.append(self.memory_limit)
    return _frontier()
  monkeypatch.setattr(P.FrontierFunction, "_price_frontier", price)
  return calls


def _ff(tmp_path, fn=None, **kw):
  mesh = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  kw.setdefault("cost", "measured")
  return P.FrontierFunction(fn or M.chain_fn(KINDS), mesh=mesh,
                            placements=("vshape",),
                            cache_dir=str(tmp_path), **kw)


def test_a_new_pricing_reads_the_frontier_from_disk(tmp_path, priced):
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  first = _ff(tmp_path)(params, batch)
  assert priced == [None]
  assert any(f.startswith("frontier-") for f in os.listdir(tmp_path))
  P.clear_memo()
  again = _ff(tmp_path)
  back = again(params, batch)
  assert priced == [None] and again.disk_hits == 1   # not priced again
  assert back == first and again.markers == 4
  # Another memory limit, another program or other inputs: priced again.
  _ff(tmp_path, memory_limit=1 << 20)(params, batch)
  assert priced == [None, 1 << 20]

  def other(p, b):   # the same structure, another computation
    return M.chain_fn(KINDS)(p, b) * 2.0
  _ff(tmp_path, fn=other)(params, batch)
  _ff(tmp_path)(params, M.make_batch(16))
  assert len(priced) == 4


def test_constants_are_part_of_the_program(tmp_path, priced):
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  base = M.chain_fn(KINDS)

  def scaled(scale):
    def fn(p, b):
      return base(p, b) * scale   # a closed-over array: a jaxpr constant
    return fn
  _ff(tmp_path, fn=scaled(jnp.full((), 2.0)))(params, batch)
  _ff(tmp_path, fn=scaled(jnp.full((), 3.0)))(params, batch)
  _ff(tmp_path, fn=scaled(jnp.full((), 3.0)))(params, batch)
  assert len(priced) == 2


def test_uniform_costs_and_bad_records_are_not_used(tmp_path, priced):
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  for _ in range(2):
    _ff(tmp_path, cost="uniform")(params, batch)
  assert len(priced) == 2   # uniform prices are cheap: never stored
  _ff(tmp_path, disk_cache=False)(params, batch)
  _ff(tmp_path, reprofile=True)(params, batch)   # measures again: prices too
  assert not os.listdir(tmp_path)
  _ff(tmp_path)(params, batch)
  (path,) = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path)]
  with open(path, encoding="utf-8") as f:
    record = json.load(f)
  record["frontier"]["pareto"] = [7]   # out of range
  with open(path, "w", encoding="utf-8") as f:
    json.dump(record, f)
  _ff(tmp_path)(params, batch)
  assert len(priced) == 6   # the bad record dropped, priced and stored
  _ff(tmp_path)(params, batch)
  assert len(priced) == 6


def test_key_depends_on_options_and_mesh():
  mesh2 = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[:2])
  mesh2b = jax.make_mesh((2,), ("pipe",), devices=jax.devices()[2:4])
  x = {"a": jnp.zeros((4, 3))}
  key = FC.frontier_key("d", x, x, mesh2, {"refine": 1})
  assert key == FC.frontier_key("d", x, x, mesh2, {"refine": 1})
  assert key != FC.frontier_key("d", x, x, mesh2, {"refine": 2})
  assert key != FC.frontier_key("d", x, x, mesh2b, {"refine": 1})
  assert key != FC.frontier_key("e", x, x, mesh2, {"refine": 1})


def test_prices_stored_by_other_code_are_not_read(tmp_path, priced,
                                                  monkeypatch):
  params, batch = M.make_params(M.num_layers(KINDS)), M.make_batch(8)
  _ff(tmp_path)(params, batch)
  monkeypatch.setattr(FC, "code_digest", lambda: "another version")
  _ff(tmp_path)(params, batch)
  assert len(priced) == 2


def test_a_flag_given_twice_keys_as_given_once(monkeypatch):
  # A child process that appends its parent's XLA flags again (the warm run
  # of experiments.auto_plan_cold did) must read the parent's frontier and
  # kernel profiles.
  from tessel_jax.cost import measure  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2,), ("pipe",))
  params, batch = {"w": jnp.ones((4, 4))}, jnp.ones((8, 4))
  keys, speeds = [], []
  for flags in ("--xla_force_host_platform_device_count=8 --xla_a=1",
                "--xla_force_host_platform_device_count=8 --xla_a=1 "
                "--xla_force_host_platform_device_count=8 --xla_a=1"):
    monkeypatch.setenv("XLA_FLAGS", flags)
    keys.append(FC.frontier_key("digest", params, batch, mesh, {}))
    speeds.append(measure.speed_flags())
  assert keys[0] == keys[1] and speeds == ["--xla_a=1"] * 2
  monkeypatch.setenv("XLA_FLAGS", "--xla_a=2")
  assert FC.frontier_key("digest", params, batch, mesh, {}) != keys[0]
