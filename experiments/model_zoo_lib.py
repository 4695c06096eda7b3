"""The model zoo (no flags here); see ``experiments.model_zoo``.

Real model definitions (``experiments.model_zoo_models``) scheduled
unmodified with ``tj.schedule(cut="auto")`` on each placement, in training
and inference. Per row (model x placement x mode):

* ``max_rel_err``: the largest ``max|a - b| / max|b|`` over the loss, the
  gradient leaves and the aux leaves (training; reference
  ``jax.value_and_grad`` per micro-batch, loss and gradients averaged, aux
  stacked) or over the outputs (inference; ``fn`` per micro-batch); leaves
  below ``FLOOR`` of their part's largest value are measured against that
  floor (:func:`max_rel_err`);
* ``first_call_s``: the first call (trace, cut, search, compile, run);
* ``step_s`` and ``plain_step_s``: the steady step (median of ``repeats``
  calls) against the plain jitted step (the reference above, jitted);
* ``blocks``: per forward block its devices and how a shared block runs
  (rows split, or what ``step.report`` says where it says more), and the
  cut's busiest block over the mean;
* ``status``: ``ok`` (within ``tolerance``), ``mismatch`` (ran, numbers
  differ), ``refused`` (a TesselError: the message says which rule),
  ``error`` (anything else) or ``skipped`` (package missing); a failing row
  never stops the run.
"""

from __future__ import annotations

import re
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

import tessel_jax as tj
from experiments import runs
from experiments.model_zoo_models import BUILDERS, ZooModel
from experiments.runs import write_text
from tessel_jax.passes import autocut

RUNNER = "model_zoo"
PLACEMENTS = ("vshape", "mshape", "nnshape")
MODES = ("train", "infer")
MESSAGE_CHARS = 200  # of an error message in the Markdown table (JSON: all)


class ZooArgs(NamedTuple):
  """Everything the runner needs; see the flags for meanings."""

  models: tuple[str, ...] = tuple(BUILDERS)
  placements: tuple[str, ...] = PLACEMENTS
  modes: tuple[str, ...] = MODES
  devices: int = 4
  microbatches: int = 4
  rows: int = 4
  repeats: int = 5
  cost: str = "uniform"
  tolerance: float = 1e-5
  output_dir: str = "results/model_zoo"
  markdown: str | None = None


# --- references ---------------------------------------------------------------


def split_microbatches(batch: Any, n: int) -> Any:
  """``(n, rows / n, ...)`` per leaf."""
  return jax.tree_util.tree_map(
      lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)


def reference(model: ZooModel, n: int, mode: str) -> Callable[[Any, Any], Any]:
  """The plain step: what ``tj.schedule`` must equal (to be jitted).

  Training: ``jax.value_and_grad`` of each micro-batch, loss and gradients
  averaged, aux stacked; inference: ``fn`` of each micro-batch, outputs
  concatenated (scalars stacked), aux stacked.
  """
  fn = model.fn

  def train(params: Any, batch: Any) -> Any:
    mbs = split_microbatches(batch, n)
    grad_fn = jax.value_and_grad(fn, has_aux=model.has_aux)
    outs = [grad_fn(params, jax.tree_util.tree_map(lambda x, m=m: x[m], mbs))
            for m in range(n)]
    values, grads = zip(*outs)
    mean = lambda *xs: sum(xs) / n
    grads = jax.tree_util.tree_map(mean, *grads)
    if not model.has_aux:
      return mean(*values), grads
    losses, auxes = zip(*values)
    return (mean(*losses), _stack(auxes)), grads

  def infer(params: Any, batch: Any) -> Any:
    mbs = split_microbatches(batch, n)
    outs = [fn(params, jax.tree_util.tree_map(lambda x, m=m: x[m], mbs))
            for m in range(n)]
    if not model.has_aux:
      return _concat(outs)
    primary, auxes = zip(*outs)
    return _concat(primary), _stack(auxes)

  return train if mode == "train" else infer


def _stack(trees: Sequence[Any]) -> Any:
  return jax.tree_util.tree_map(lambda *xs: jax.numpy.stack(xs), *trees)


def _concat(trees: Sequence[Any]) -> Any:
  return jax.tree_util.tree_map(
      lambda *xs: (jax.numpy.concatenate(xs) if xs[0].ndim else
                   jax.numpy.stack(xs)), *trees)


FLOOR = 1e-2


def max_rel_err(got: Any, want: Any, floor: float = FLOOR) -> float:
  """Largest ``max|a - b| / max|b|`` over the leaves (structures must match).

  A leaf whose reference is below ``floor`` times the largest reference
  value of the tree is measured against that floor instead: gradients that
  vanish mathematically (an attention key bias's, softmax being shift
  invariant; a conv bias before a BatchNorm) are rounding noise of 1e-9
  in both programs.

  Raises:
    ValueError: if the pytree structures or leaf shapes differ.
  """
  a_leaves, a_tree = jax.tree_util.tree_flatten(got)
  b_leaves, b_tree = jax.tree_util.tree_flatten(want)
  if a_tree != b_tree:
    raise ValueError(f"result structure {a_tree} differs from {b_tree}")
  pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64))
           for a, b in zip(a_leaves, b_leaves)]
  top = max([float(np.max(np.abs(b), initial=0.0)) for _, b in pairs] + [0.0])
  errs = [0.0]
  for a, b in pairs:
    if a.shape != b.shape:
      raise ValueError(f"a result leaf has shape {a.shape}, want {b.shape}")
    scale = max(float(np.max(np.abs(b), initial=0.0)), floor * top, 1e-30)
    errs.append(float(np.max(np.abs(a - b), initial=0.0)) / scale)
  return max(errs)


def result_err(got: Any, want: Any, mode: str, has_aux: bool) -> float:
  """:func:`max_rel_err` of each part (loss, aux, gradients / outputs, aux)
  on its own, the largest of them."""
  if mode == "train":
    (value, grads), (ref_value, ref_grads) = got, want
    parts = [(grads, ref_grads)]
    parts += ([(value[0], ref_value[0]), (value[1], ref_value[1])] if has_aux
              else [(value, ref_value)])
  else:
    parts = list(zip(got, want)) if has_aux else [(got, want)]
  return max(max_rel_err(a, b) for a, b in parts)


# --- one row ------------------------------------------------------------------


def _timed(f: Callable[[], Any]) -> tuple[Any, float]:
  t0 = time.perf_counter()
  out = jax.block_until_ready(f())
  return out, time.perf_counter() - t0


def _steady(f: Callable[[], Any], repeats: int) -> float:
  return statistics.median(_timed(f)[1] for _ in range(repeats))


def block_info(step: Any) -> dict[str, Any]:
  """Per forward block: devices and how it runs; the cut's balance."""
  built = step.built
  # step.report.block_modes: {"F0": "split 4-way" | "replicated: <why>"}
  # where the report says how shared blocks run; else read the kernels.
  modes = dict(getattr(built.report, "block_modes", None) or {})
  blocks = []
  for k in sorted((k for k in built.kernels.kernels.values() if k.kind == "F"),
                  key=lambda k: k.fwd):
    if f"F{k.fwd}" in modes:
      how = str(modes[f"F{k.fwd}"])
    elif len(k.devices) == 1:
      how = "one device"
    elif k.split > 1 and any(k.in_split):
      how = f"rows split /{k.split}"
    else:
      how = f"on {len(k.devices)} devices, rows not split"
    blocks.append({"block": k.fwd, "devices": list(k.devices), "mode": how})
  info = autocut.cut_info(built.partition.traced)
  balance = None
  if info is not None and info.block_costs:
    costs = np.asarray(info.block_costs, np.float64)
    balance = float(costs.max() / max(costs.mean(), 1e-30))
  return {"blocks": blocks, "busiest_over_mean": balance}


def run_case(model: ZooModel, placement: str, mode: str,
             args: ZooArgs) -> dict[str, Any]:
  """One row; never raises (the failure is recorded)."""
  row: dict[str, Any] = {"model": model.name, "package": model.package,
                         "placement": placement, "mode": mode}
  try:
    mesh = jax.make_mesh((args.devices,), ("pipe",))
    step = tj.schedule(model.fn, mesh=mesh,
                       placement=tj.placements.get(placement, args.devices),
                       num_microbatches=args.microbatches, mode=mode,
                       has_aux=model.has_aux, cut="auto", cost=args.cost)
    plain = jax.jit(reference(model, args.microbatches, mode))
    got, first = _timed(lambda: step(model.params, model.batch))
    want, plain_first = _timed(lambda: plain(model.params, model.batch))
    row.update(first_call_s=first, plain_first_call_s=plain_first)
    row["max_rel_err"] = result_err(got, want, mode, model.has_aux)
    row.update(block_info(step))
    row["step_s"] = _steady(lambda: step(model.params, model.batch),
                            args.repeats)
    row["plain_step_s"] = _steady(lambda: plain(model.params, model.batch),
                                  args.repeats)
    row["status"] = ("ok" if row["max_rel_err"] <= args.tolerance
                     else "mismatch")
  except tj.TesselError as err:
    row.update(status="refused", message=str(err))
  except Exception as err:  # pylint: disable=broad-except
    row.update(status="error", message=f"{type(err).__name__}: {err}",
               where=traceback.format_exc(limit=-3))
  return row


def build_model(name: str, rows: int) -> tuple[ZooModel | None, str | None]:
  """The model, or None and why it cannot be built here."""
  try:
    return BUILDERS[name](rows), None
  except ImportError as err:
    return None, f"package missing ({err}); pip install -e '.[models]'"
  except Exception as err:  # pylint: disable=broad-except
    return None, f"could not build: {type(err).__name__}: {err}"


def run_all(args: ZooArgs, log: Callable[[str], None] = print
            ) -> list[dict[str, Any]]:
  """Every row of ``args`` (models x placements x modes)."""
  rows = []
  for name in args.models:
    model, why = build_model(name, args.rows * args.microbatches)
    for placement in args.placements:
      for mode in args.modes:
        if model is None:
          row = {"model": name, "placement": placement, "mode": mode,
                 "status": "skipped", "message": why}
        else:
          row = run_case(model, placement, mode, args)
        log(summary_line(row))
        rows.append(row)
  return rows


# --- reporting ----------------------------------------------------------------


def summary_line(row: dict[str, Any]) -> str:
  head = f"{row['model']:16s} {row['placement']:8s} {row['mode']:5s}"
  if "max_rel_err" in row and "step_s" in row:
    return (f"{head} {row['status']:8s} err {row['max_rel_err']:.1e}"
            f" first {row['first_call_s']:.1f}s step"
            f" {row['step_s'] * 1e3:.1f} ms (plain"
            f" {row['plain_step_s'] * 1e3:.1f} ms)")
  return f"{head} {row['status']:8s} {row.get('message', '')[:160]}"


def _blocks_text(row: dict[str, Any]) -> str:
  shared = [f"F{b['block']}: {b['mode']}" for b in row.get("blocks", [])
            if len(b["devices"]) > 1]
  text = "; ".join(shared) if shared else "all on one device"
  if row.get("busiest_over_mean") is not None:
    text += f"; busiest/mean {row['busiest_over_mean']:.2f}"
  return text


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  """The results as a Markdown table."""
  lines = ["| model | placement | mode | status | max rel. err | first call s"
           " | step ms | plain ms | blocks / message |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    if "step_s" in r:
      cells = [f"{r['max_rel_err']:.1e}", f"{r['first_call_s']:.1f}",
               f"{r['step_s'] * 1e3:.1f}", f"{r['plain_step_s'] * 1e3:.1f}",
               _blocks_text(r)]
    else:
      msg = r.get("message", "").replace("|", "/").replace("\n", " ")
      msg = re.sub(r"^tessel_jax\.schedule applied to '[^']*': ", "", msg)
      cells = ["", "", "", "", msg if len(msg) <= MESSAGE_CHARS else
               msg[:MESSAGE_CHARS - 3] + "..."]
    lines.append("| " + " | ".join(
        [r["model"], r["placement"], r["mode"], r["status"]] + cells) + " |")
  return "\n".join(lines) + "\n"


def main(args: ZooArgs) -> int:
  """Runs the zoo, writes JSON (and Markdown); exit code 0."""
  results = runs.new_results(RUNNER, args)
  results["devices"] = [str(d) for d in jax.devices()[:args.devices]]
  results["rows"] = run_all(args)
  path = runs.write(results)
  print(f"wrote {path}")
  if args.markdown:
    write_text(args.markdown, markdown(results["rows"]))
    print(f"wrote {args.markdown}")
  counts: dict[str, int] = {}
  for r in results["rows"]:
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
  return 0


__all__ = ["ZooArgs", "main", "markdown", "max_rel_err", "reference",
           "run_all", "run_case"]
