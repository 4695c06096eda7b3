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
    # sliced before the costing), ignoring the model's marker after block 5.
    "auto_cut": {"cut": "auto", "cost": "measured"},
    # The marker after basic block 1, 2, 3 or 4 (``resnet.make_loss``'s
    # ``cut_after``) instead of 5: more of the network on device 1.
    "cut1": {"cut_after": (1,)},
    "cut2": {"cut_after": (2,)},
    "cut3": {"cut_after": (3,)},
    "cut4": {"cut_after": (4,)},
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
