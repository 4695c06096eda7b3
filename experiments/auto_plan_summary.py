"""The auto_plan runner's summary of one memory limit's measured rows
(``experiments.auto_plan_lib`` times them): the chosen plan against the
fastest measured candidate (medians, then per-round paired ratios, wall
and process CPU), against its control (the noise floor) and the plain
step, and a measured tie-break replayed from the rows' rounds.

A row is a dict with ``label``, ``chosen``, ``predicted_ms`` and, once
timed, ``measured_ms``, ``measured_cpu_ms`` and ``rounds_ms`` (``[wall,
cpu]`` per round); ``reference`` and ``control`` mark the rows that are
never candidates.
"""

from __future__ import annotations

import statistics
from typing import Any

TARGET = 1.05  # chosen within 5% of the fastest measured fitting candidate


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """Chosen against the fastest measured candidate (all fit the limit)."""
  ok = [r for r in rows if "measured_ms" in r and not r.get("reference")
        and not r.get("control")]
  chosen = next((r for r in ok if r["chosen"]), None)
  if chosen is None or not ok:
    return {"error": "the chosen plan was not measured"}
  control = next((r for r in rows if r.get("control") and "measured_ms" in r),
                 None)
  fastest = min(ok, key=lambda r: r["measured_ms"])
  ratio = chosen["measured_ms"] / fastest["measured_ms"]
  return {"chosen": chosen["label"], "chosen_predicted_ms":
          chosen["predicted_ms"], "chosen_measured_ms": chosen["measured_ms"],
          "fastest_measured": fastest["label"],
          "fastest_measured_ms": fastest["measured_ms"],
          "chosen_over_fastest": round(ratio, 4),
          "within_target": ratio <= TARGET, **_reference(rows),
          **_cpu_ratio(ok, chosen),
          **paired_ratios(ok, chosen), **_control(chosen, control),
          **tiebreak(ok, chosen)}


#: A measured tie-break (:func:`tiebreak`): plans predicted within this
#: share of the chosen one, at most ``TIE_TOP`` of them, timed for
#: ``TIE_STEPS`` steps each.
TIE_MARGIN, TIE_TOP, TIE_STEPS = 0.05, 3, 3


def tiebreak(ok: list[dict[str, Any]], chosen: dict[str, Any],
             margin: float = TIE_MARGIN, top: int = TIE_TOP,
             steps: int = TIE_STEPS) -> dict[str, Any]:
  """What a measured tie-break would have chosen, replayed from the rows'
  rounds: the ``top`` plans predicted within ``margin`` of the chosen
  one's prediction (the chosen one first), each timed for its first
  ``steps`` rounds, the fastest median taken. Gives its label, its paired
  ratio over the best other candidate on the later rounds (as
  ``chosen_over_best_paired``) and what it would cost before the first
  step: building and compiling the other plans (``build_compile_s``,
  wall) and the timed steps. Empty where fewer than two plans tie."""
  pred = chosen.get("predicted_ms")
  if pred is None or not chosen.get("rounds_ms"):
    return {}
  ties = sorted((r for r in ok if r.get("rounds_ms") and
                 r.get("predicted_ms") is not None and
                 r["predicted_ms"] <= (1 + margin) * pred),
                key=lambda r: (r is not chosen, r["predicted_ms"]))[:top]
  if len(ties) < 2:
    return {}
  pick = min(ties, key=lambda r: statistics.median(
      w for w, _ in r["rounds_ms"][:steps]))
  # Judged on the rounds after those it was picked on (out of sample).
  rest = [dict(r, rounds_ms=r["rounds_ms"][steps:]) for r in ok]
  others = paired_ratios(rest, next(
      b for a, b in zip(ok, rest) if a is pick))
  cost = sum(r.get("build_compile_s", [0.0])[0] for r in ties
             if r is not chosen) + sum(
                 w for r in ties for w, _ in r["rounds_ms"][:steps]) / 1e3
  return {"tiebreak": [r["label"] for r in ties], "tiebreak_pick":
          pick["label"], "tiebreak_over_best_paired":
          others.get("chosen_over_best_paired"),
          "tiebreak_cost_s": round(cost, 2)}


def _control(chosen: dict[str, Any], control: dict[str, Any] | None
             ) -> dict[str, Any]:
  """The chosen plan over its control (the same plan compiled again, timed
  in the same rounds), per round then the median, wall and CPU: how far
  two runs of one program differ here (the noise floor of every ratio)."""
  if control is None:
    return {}
  got = paired_ratios([chosen, control], chosen).get("paired_wall_cpu", {})
  out = {"control_ms": [control["measured_ms"],
                        control.get("measured_cpu_ms")]}
  if got:
    out["chosen_over_control_paired"] = next(iter(got.values()))
  return out


def paired_ratios(ok: list[dict[str, Any]], chosen: dict[str, Any]
                  ) -> dict[str, Any]:
  """Chosen over each other measured candidate, per round (both timed in
  the same round) then the median over rounds, wall and CPU; and the
  largest of them (``chosen_over_best_paired``: above 1 when some
  candidate ran faster in most rounds). Empty without per-round times."""
  mine = chosen.get("rounds_ms")
  if not mine:
    return {}
  out: dict[str, list[float]] = {}
  for r in ok:
    theirs = r.get("rounds_ms")
    if r is chosen or not theirs or len(theirs) != len(mine):
      continue
    out[r["label"]] = [
        round(statistics.median(a[k] / b[k] for a, b in zip(mine, theirs)),
              4) for k in (0, 1)]
  if not out:
    return {}
  return {"paired_wall_cpu": out,
          "chosen_over_best_paired": max(v[0] for v in out.values()),
          "chosen_over_best_paired_cpu": max(v[1] for v in out.values())}


def _reference(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """The reference row's step (wall, CPU ms), when measured."""
  ref = next((r for r in rows if r.get("reference") and "measured_ms" in r),
             None)
  if ref is None:
    return {}
  return {"reference_ms": [ref["measured_ms"], ref["measured_cpu_ms"]]}


def _cpu_ratio(ok: list[dict[str, Any]], chosen: dict[str, Any]
               ) -> dict[str, Any]:
  """The same comparison in process CPU per step (steadier than wall time
  on a shared machine), when measured."""
  cpu = [r for r in ok if "measured_cpu_ms" in r]
  if "measured_cpu_ms" not in chosen or not cpu:
    return {}
  fastest = min(cpu, key=lambda r: r["measured_cpu_ms"])
  return {"chosen_measured_cpu_ms": chosen["measured_cpu_ms"],
          "fastest_cpu": fastest["label"],
          "chosen_over_fastest_cpu": round(
              chosen["measured_cpu_ms"] / fastest["measured_cpu_ms"], 4)}


__all__ = ["TARGET", "paired_ratios", "summarise", "tiebreak"]
