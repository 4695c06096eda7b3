"""Where one step of a compiled program spends its time, from XLA's trace.

XLA's CPU runtime records every thunk it runs (an HLO instruction: a
fusion, a dot, a ``conditional``, a ``collective-permute``) in the JAX
profiler's trace, with the thread it ran on, and the rendezvous of each
collective inside it. ``passes.lower`` runs each part of a tick under a
name scope (``passes.lower.SCOPES``) that reaches every instruction's
``op_name`` metadata, so each thunk is charged to one part:

* ``kernels``: the blocks' own code (``tj_kernel``) and the parameter
  reads in front of it (``tj_params``);
* ``ppermute/rendezvous``: the collectives (``tj_ppermute``), waiting for
  the other device included, and the payload selection (``tj_send``);
* ``stash``: reads and writes of stash slots (``tj_stash_read`` /
  ``tj_stash_write``);
* ``grad accumulation``: in-place adds into the gradient accumulators
  (``tj_accumulate``);
* ``switch/loop``: time inside a ``conditional`` or ``while`` not spent in
  the instructions it runs (branch selection, operand and result copies);
* ``pack/unpack``: outside the ``shard_map`` (parameters stacked into
  per-device buffers, gradients unpacked: once per step);
* ``other``: everything else (table lookups, terminals, zero-filled
  stash and accumulators at the start).

Times are *self* times (an instruction's time minus the instructions
nested in it on the same thread), summed over all threads and divided by
the number of devices: per device and step. ``idle`` is the step's wall
time minus that busy time (a device thread waiting outside a collective,
or the runtime between thunks).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

PARTS = ("kernels", "ppermute/rendezvous", "stash", "grad accumulation",
         "switch/loop", "pack/unpack", "other")
_SCOPE_PART = (("tj_ppermute", "ppermute/rendezvous"),
               ("tj_send", "ppermute/rendezvous"),
               ("tj_accumulate", "grad accumulation"),
               ("tj_stash_read", "stash"), ("tj_stash_write", "stash"),
               ("tj_kernel", "kernels"), ("tj_params", "kernels"))
INSTR = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = [^=]*?\b([a-z][\w\-]*)\(')
_INSTR = INSTR  # the name experiments.model_zoo_kernels_lib reads
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_KERNEL = re.compile(r"tj_kernel/k(\d+)")
_COLLECTIVES = ("collective-permute", "all-reduce", "all-gather",
                "all-to-all", "reduce-scatter")


def instruction_parts(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> the part of a step it belongs to."""
  out = {}
  for line in hlo_text.splitlines():
    m = INSTR.match(line)
    if not m:
      continue
    name, opcode = m.groups()
    op = _OP_NAME.search(line)
    scope = op.group(1) if op else ""
    part = next((p for key, p in _SCOPE_PART if key in scope), None)
    if part is None:
      if scope and "shard_map" not in scope:
        part = "pack/unpack"
      elif opcode in ("conditional", "while", "call"):
        part = "switch/loop"
      elif opcode in _COLLECTIVES:
        part = "ppermute/rendezvous"
      else:
        part = "other"
    out[name] = part
  return out


def kernel_instructions(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> ``"k<id>"``: the instructions of each kernel's
  own code (``passes.lower`` scope ``tj_kernel/k<id>``)."""
  out = {}
  for line in hlo_text.splitlines():
    m = INSTR.match(line)
    op = _OP_NAME.search(line) if m else None
    k = _KERNEL.search(op.group(1)) if op else None
    if k:
      out[m.group(1)] = f"k{k.group(1)}"
  return out


def kernel_seconds(events: list[Mapping[str, Any]], hlo_text: str
                   ) -> dict[int, float]:
  """Kernel id -> seconds its own instructions ran in the traced step
  (self times, summed over every device thread)."""
  labels = kernel_instructions(hlo_text)
  got = label_times(events, labels)
  return {int(k[1:]): v for k, v in got.items()}


def self_times(events: list[Mapping[str, Any]], parts: Mapping[str, str]
               ) -> dict[str, float]:
  """Seconds per part: self time of every instruction event, all threads."""
  got = label_times(events, parts)
  return {p: got.get(p, 0.0) for p in PARTS}


def label_times(events: list[Mapping[str, Any]], labels: Mapping[str, str]
                ) -> dict[str, float]:
  """Seconds per label (``labels``: instruction name -> label): self time
  of every instruction event, all threads."""
  parts = labels
  by_tid: dict[Any, list] = collections.defaultdict(list)
  for e in events:
    if e.get("ph") == "X" and e.get("name") in parts:
      by_tid[e.get("tid")].append((float(e["ts"]), float(e.get("dur", 0.0)),
                                   parts[e["name"]]))
  total: dict[str, float] = collections.defaultdict(float)
  for evs in by_tid.values():
    evs.sort(key=lambda x: (x[0], -x[1]))
    stack: list[list] = []          # [end, part, self_us]
    for ts, dur, part in evs:
      while stack and stack[-1][0] <= ts:
        end, p, own = stack.pop()
        total[p] += own
      if stack:
        stack[-1][2] -= dur
      stack.append([ts + dur, part, dur])
    for _, p, own in stack:
      total[p] += own
  return {p: v * 1e-6 for p, v in total.items()}


def trace_events(run: Callable[[], Any]) -> tuple[list[Any], float]:
  """``(trace events, wall seconds)`` of one traced call of ``run``."""
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp, create_perfetto_trace=True)
    t0 = time.perf_counter()
    jax.block_until_ready(run())
    wall = time.perf_counter() - t0
    jax.profiler.stop_trace()
    path = sorted(glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True))
    with gzip.open(path[-1]) as f:
      trace = json.load(f)
  return (trace["traceEvents"] if isinstance(trace, dict) else trace), wall


def profile_step(run: Callable[[], Any], hlo_text: str, num_devices: int,
                 repeats: int = 3) -> dict[str, Any]:
  """Profiles ``run`` (one step) ``repeats`` times; per-device ms per part.

  Returns the median step's figures: ``wall_ms``, one entry per part of
  ``PARTS`` (ms per device), ``idle`` and the busy share of the wall time.
  """
  parts = instruction_parts(hlo_text)
  jax.block_until_ready(run())
  rows = []
  for _ in range(repeats):
    events, wall = trace_events(run)
    secs = self_times(events, parts)
    row = {"wall_ms": 1e3 * wall}
    row.update({p: 1e3 * s / num_devices for p, s in secs.items()})
    busy = sum(row[p] for p in PARTS)
    row["idle"] = max(0.0, row["wall_ms"] - busy)
    row["busy_share"] = busy / row["wall_ms"]
    rows.append(row)
  rows.sort(key=lambda r: r["wall_ms"])
  return {k: round(v, 3) for k, v in rows[len(rows) // 2].items()}


def markdown(rows: list[dict[str, Any]]) -> str:
  """One line per (model, plan): ms per device and step, by part."""
  head = ["model", "plan", "lowered as", "step ms"] + list(PARTS) + [
      "idle", "busy"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["model"], r["plan"], f"`{r['lowered_as']}`",
             f"{r['wall_ms']:.1f}"] + [f"{r[p]:.1f}" for p in PARTS] + [
                 f"{r['idle']:.1f}", f"{100 * r['busy_share']:.0f}%"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
