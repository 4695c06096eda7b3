"""The lowering variants of the placed ResNet18 step that
``experiments.resnet_ab`` and ``experiments.train_step_ab`` time (no flags
here, so both runners can import it)."""

#: Variant name -> ``tj.schedule`` keyword arguments (``switches`` as a
#: dict of ``passes.switches.Switches`` fields).
VARIANTS = {
    "base": {},
    "ticks": {"switches": {"tick_order": True}},
    "unrolled": {"interpret_ramps": None},
    "ticks_unrolled": {"switches": {"tick_order": True},
                       "interpret_ramps": None},
    "nohoist": {"switches": {"hoist": False}},
    "workspace": {"switches": {"workspace": True}},
    "nohoist_workspace": {"switches": {"hoist": False, "workspace": True}},
    "dead_taps": {"switches": {"dead_taps": True}},  # the default since s32
    "live_taps": {"switches": {"dead_taps": False}},
    "dead_taps_workspace": {"switches": {"dead_taps": True,
                                         "workspace": True}},
    # The automatic cut on measured costs of the program it runs (dead taps
    # sliced before the costing), ignoring the model's marker.
    "auto_cut": {"cut": "auto", "cost": "measured"},
    # The automatic cut on analytic costs (the roofline: ``cost="uniform"``
    # prices the cut analytically), schedule searched on uniform spans as
    # base's: the cut alone moves (``experiments.placed_bench``'s model).
    "auto_uniform": {"cut": "auto"},
    # The same two with the cut also pricing each micro-batch's
    # parameter-gradient adds (``Switches.cut_accumulation``, off by
    # default; session 38).
    "auto_cut_acc": {"cut": "auto", "cost": "measured",
                     "switches": {"cut_accumulation": True}},
    "auto_uniform_acc": {"cut": "auto",
                         "switches": {"cut_accumulation": True}},
    # Dead-tap weight gradients added whole (``Switches.grad_windows``
    # off), as before 2026-11-27.
    "no_grad_windows": {"switches": {"grad_windows": False}},
    "auto_no_grad_windows": {"cut": "auto",
                             "switches": {"grad_windows": False}},
    # Convolutions as JAX emits them (``Switches.conv_forms`` off; in the
    # ticks' branches XLA:CPU runs the backward ones as generic loops), as
    # before 2026-11-27; with hoisting off too.
    "no_conv_forms": {"switches": {"conv_forms": False}},
    "nohoist_no_conv_forms": {"switches": {"hoist": False,
                                           "conv_forms": False}},
    # The marker after basic block 1 to 5 (``resnet.make_loss``'s
    # ``cut_after``) instead of ``placed_bench.RESNET_CUT_AFTER`` (3, where
    # the automatic cut lands; 5 before 2026-11-27).
    "cut1": {"cut_after": (1,)},
    "cut2": {"cut_after": (2,)},
    "cut3": {"cut_after": (3,)},
    "cut4": {"cut_after": (4,)},
    "cut5": {"cut_after": (5,)},
    # Equal zero fills merged by XLA and copied into each carry
    # (``Switches.distinct_fills`` off), as before 2026-11-27.
    "shared_fills": {"switches": {"distinct_fills": False}},
    # Hoisted values computed on every device, also those only another
    # device's kernels read (``Switches.hoist_on_users`` off), as before
    # 2026-11-27.
    "hoist_everywhere": {"switches": {"hoist_on_users": False}},
    "cut5_no_grad_windows": {"cut_after": (5,),
                             "switches": {"grad_windows": False}},
}


def check_names(names) -> None:
  """Raises ``absl.app.UsageError`` unless ``names`` (``--variants``) are
  known variants, at least one."""
  from absl import app  # pylint: disable=import-outside-toplevel
  bad = [v for v in names if v not in VARIANTS]
  if bad or not names:
    raise app.UsageError(f"unknown --variants {bad}; choose from"
                         f" {sorted(VARIANTS)}")


def build(name, fn, params, batch, n):
  """``(run, step, compiled)`` of variant ``name``, placed."""
  import jax  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  from tessel_jax import placements  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes.switches import Switches  # pylint: disable=import-outside-toplevel
  kw = {"cut": "markers", "cost": "uniform", **VARIANTS[name]}
  if "cut_after" in kw:
    from experiments import resnet  # pylint: disable=import-outside-toplevel
    fn = resnet.make_loss(tj.boundary, cut_after=kw.pop("cut_after"))
  kw["switches"] = Switches(**kw.get("switches", {}))
  mesh = jax.make_mesh((2,), ("pipe",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  step = tj.schedule(fn, mesh=mesh, placement=placements.vshape(2),
                     num_microbatches=n, param_layout="auto", **kw)
  placed = step.place(params, batch)
  compiled = step.lower(placed, batch).compile()
  # step(placed, batch), not compiled(...): a workspace step passes its
  # workspace (Switches.workspace); every variant is called the same way.
  return (lambda: step(placed, batch)), step, compiled
