"""The paired compile runner's arithmetic and the HLO split by kind.

``experiments.peer_compile`` reads ratios of the same round (tessel_jax over
the hand GPipe, a version over the base) and their medians;
``experiments.hlo_parts`` splits compiled HLO text by kind and groups fused
computations by content. Both are checked here on small made-up inputs (no
compile).
"""

from __future__ import annotations

import os

from experiments import hlo_parts, peer_compile_lib

HLO = """HloModule m, entry_computation_layout={()->s32[]}

%fused_a (p0: s32[4], p1: s32[]) -> s32[] {
  %p0 = s32[4]{0} parameter(0)
  %p1 = s32[] parameter(1)
  %ds = s32[1]{0} dynamic-slice(%p0, %p1), dynamic_slice_sizes={1}, metadata={op_name="jit(f)/dynamic_slice"}
  ROOT %b = s32[] bitcast(%ds)
}

%fused_b (q0: s32[4], q1: s32[]) -> s32[] {
  %q0 = s32[4]{0} parameter(0)
  %q1 = s32[] parameter(1)
  %dq = s32[1]{0} dynamic-slice(%q0, %q1), dynamic_slice_sizes={1}, metadata={op_name="jit(f)/other"}
  ROOT %c = s32[] bitcast(%dq)
}

%wrapped_broadcast_computation (r0: f32[]) -> f32[8] {
  %r0 = f32[] parameter(0)
  ROOT %bc = f32[8]{0} broadcast(%r0), dimensions={}
}

%body (t: (s32[], s32[4])) -> (s32[], s32[4]) {
  %t = (s32[], s32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = s32[4]{0} get-tuple-element(%t), index=1
  %f = s32[] fusion(%x, %i), kind=kLoop, calls=%fused_a
  ROOT %r = (s32[], s32[4]{0}) tuple(%f, %x)
}

%cond (u: (s32[], s32[4])) -> pred[] {
  %u = (s32[], s32[4]{0}) parameter(0)
  %j = s32[] get-tuple-element(%u), index=0
  %k = s32[4]{0} get-tuple-element(%u), index=1
  %g = s32[] fusion(%k, %j), kind=kLoop, calls=%fused_b
  ROOT %lt = pred[] compare(%g, %g), direction=LT
}

ENTRY %main () -> s32[] {
  %z = f32[] constant(0)
  %w = f32[8]{0} fusion(%z), kind=kLoop, calls=%wrapped_broadcast_computation
  %c0 = s32[] constant(0)
  %c4 = s32[4]{0} constant({1, 2, 3, 4})
  %t0 = (s32[], s32[4]{0}) tuple(%c0, %c4)
  %wl = (s32[], s32[4]{0}) while(%t0), condition=%cond, body=%body, metadata={op_name="jit(f)/while"}
  ROOT %o = s32[] get-tuple-element(%wl), index=0
}
"""


def test_distinct_fusions_group_by_content_not_name():
  groups = hlo_parts.distinct_fusions(HLO)
  assert sorted(len(g) for g in groups) == [1, 2]
  assert ["%fused_a", "%fused_b"] in groups


def test_parts_split_the_text_by_kind():
  parts = hlo_parts.parts(HLO)
  assert sum(parts.values()) == len(HLO) - 2 * HLO.count("\n\n")
  assert parts["metadata"] == sum(
      len(m) for m in hlo_parts._METADATA.findall(HLO))  # pylint: disable=protected-access
  assert parts["fusion:scalar"] > 0 and parts["fusion:fill"] > 0
  for kind in ("plumbing", "fusion_calls", "headers"):
    assert parts[f"while_body:{kind}"] > 0
  assert parts["while_cond:ops"] > 0      # the compare
  assert parts["entry:plumbing"] > 0      # constants, tuple, while, gte
  summary = hlo_parts.summary(HLO)
  assert summary["while_loops"] == 1
  assert summary["distinct_fusions"] == 2
  assert summary["fusions"] == 3


def _round(times: dict[str, tuple[float, float]]) -> dict:
  return {"times": {k: {"cpu_s": c, "wall_s": w, "hlo_chars": 1000}
                    for k, (c, w) in times.items()}}


def test_summary_ratios_are_paired_per_round():
  args = peer_compile_lib.CompileArgs(
      variants=("hand_gpipe", "tj_compact"), ns=(8,), rounds=3,
      versions=(("base", ""), ("new", "/x")), output=None)
  # A round where everything ran twice as slow (a loaded machine) keeps
  # the ratios of the other rounds: tessel_jax 1.5x the hand, new 0.8x base.
  rounds = [_round({"base hand_gpipe 8": (s * 1.0, s), "base tj_compact 8":
                    (s * 1.5, s), "new hand_gpipe 8": (s * 1.0, s),
                    "new tj_compact 8": (s * 1.2, s)})
            for s in (1.0, 2.0, 1.0)]
  out = peer_compile_lib.summarise(rounds, args)
  assert out["x_hand"]["base tj_compact 8"]["cpu"] == 1.5
  assert out["x_hand"]["new tj_compact 8"]["cpu"] == 1.2
  assert out["x_base"]["new tj_compact 8"]["cpu"] == 0.8
  assert out["x_base"]["new hand_gpipe 8"]["cpu"] == 1.0
  assert out["cases"]["base tj_compact 8"]["compile_cpu_s"] == 1.5
  assert "base hand_gpipe 8" not in out["x_hand"]
  assert "| new tj_compact 8 | 1.2 |" in peer_compile_lib.markdown(out)


def test_version_path_serves_that_trees_packages(tmp_path):
  tree = tmp_path / "tree"
  (tree / "tessel_jax").mkdir(parents=True)
  (tree / "tessel_jax" / "__init__.py").write_text("")
  (tree / "passes").mkdir()
  (tree / "passes" / "lower.py").write_text("")
  first = peer_compile_lib.version_path(str(tree), str(tmp_path / "tmp"))
  pkg = os.path.join(first, "tessel_jax")
  assert os.path.realpath(os.path.join(pkg, "__init__.py")) == str(
      tree / "tessel_jax" / "__init__.py")
  assert os.path.realpath(os.path.join(pkg, "passes", "lower.py")) == str(
      tree / "passes" / "lower.py")
  assert peer_compile_lib.version_path("", str(tmp_path)) == ""
