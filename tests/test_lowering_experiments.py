"""Smoke tests of experiments.train and experiments.lowering_bench (tiny)."""

from __future__ import annotations

import jax

from experiments import lowering_bench_lib, train_lib


def test_train_lib_runs_checks_and_learns(tmp_path, monkeypatch):
  args = train_lib.TrainArgs(
      placement="vshape", devices=2, layers=2, d_model=16, heads=2, seq=8,
      microbatches=4, microbatch_size=2, steps=4, lr=1e-2, time_limit=10.0,
      plot=str(tmp_path / "s.png"), output=None, grid_steps=16)
  lines = []
  adam = train_lib.adam
  monkeypatch.setattr(train_lib, "adam", lambda *a: (
      lines.append("<adam>"), adam(*a))[1])
  record = train_lib.run(args, log=lines.append)
  # The first step shows before the optimiser's first (compiling) call.
  assert lines.index("<adam>") > next(
      i for i, l in enumerate(lines) if l.startswith("step   0"))
  assert record["check_grad_rel_err"] <= 1e-5
  assert record["check_loss_rel_err"] <= 1e-5
  assert record["losses"][-1] < record["losses"][0]
  assert (tmp_path / "s.png").exists()
  assert any(line.startswith("dev0") for text in lines
             for line in text.splitlines())


def test_layer_groups_put_the_embedding_alone_in_block_0():
  assert train_lib.layer_groups(4, 5) == [[], [0], [1], [2], [3]]
  assert train_lib.layer_groups(4, 4) == [[], [0, 1], [2], [3]]


def test_bench_compile_part_and_copy_counter():
  args = lowering_bench_lib.BenchArgs(parts=("compile",), compile_n=(4, 16),
                                      devices=2, repeats=1, output=None)
  out = lowering_bench_lib.part_compile(args, log=lambda s: None)
  assert [r["n"] for r in out["rows"]] == [4, 16]
  # The default lowering (compact): every tick in one table-driven loop.
  assert [r["lowered_as"] for r in out["rows"]] == [
      f"interp({r['ticks']})" for r in out["rows"]]
  text = """%body (p: (f32[3,4])) -> f32[3,4] {
  %a = f32[3,4]{1,0} copy(%p)
  %b = f32[4]{0} copy(%q)
}
ENTRY %main () -> f32[] {
  %w = (f32[3,4]) while(%t), condition=%cond, body=%body
}
"""
  assert lowering_bench_lib.loop_copies(text, [(3, 4)]) == {
      "stash_sized": 1, "all": 2}
  assert jax.devices()  # conftest's fake devices are in use


def test_train_runner_takes_the_library_default_unless_told():
  from experiments import train_lib  # pylint: disable=import-outside-toplevel
  for steps in (1, 30, 10_000):
    assert train_lib.interpret_ramps_for(steps, None) == "auto"
    assert train_lib.interpret_ramps_for(steps, 8) == 8     # the flag wins
    assert train_lib.interpret_ramps_for(steps, 0) == 0
    assert train_lib.interpret_ramps_for(steps, -1) is None  # unroll all




def test_deferred_weight_gradients_equal_the_plain_gradient():
  from experiments import deferred_w_lib as lib  # pylint: disable=import-outside-toplevel
  from experiments import rel_err  # pylint: disable=import-outside-toplevel
  p, xs, ys = lib.inputs(3, 2, cin=4, cout=8, classes=5)
  flat = lambda a: a.reshape((-1,) + a.shape[2:])
  want = jax.jit(jax.grad(lib.loss, argnums=(0, 1)), static_argnums=3)(
      p, flat(xs), flat(ys), 1 / 6)
  grads, gxs = lib.programs(3, 2)["deferred"](p, xs, ys)
  assert rel_err.max_rel((grads, flat(gxs)), want) <= 1e-5
