"""Counts parameter-sized work in compiled HLO text, branch by branch.

``jax.jit(...).lower(...).compile().as_text()`` lists one computation per
block of code: the entry, while-loop bodies, conditional branches and
fusions. ``param_ops`` walks them from the entry and reports, for buffers of
the given shapes, how many ``add``, ``copy``, ``select`` and zero
``broadcast`` instructions sit in code that runs whatever the device does
outside any branch, split into code run once (``"once"``: the entry and what
it calls outside loops) and code run every loop iteration (``"loop"``:
while-loop bodies and what they call outside branches), and how many sit
inside conditional branches, which run only on the devices whose block runs
at that tick (``"once_branches"``, ``"loop_branches"``).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

OPS = ("add", "copy", "select", "broadcast")
WHERE = ("once", "loop", "once_branches", "loop_branches")
_CALLS = re.compile(r"(to_apply=|calls=|body=|condition=)%?([^,\s}]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_INSTR = re.compile(r"= (\w+)\[([0-9,]*)\]\S* ([\w-]+)\(")


def computations(text: str) -> tuple[dict[str, list[str]], str]:
  """``({name: instruction lines}, entry name)`` of an HLO module's text."""
  comps: dict[str, list[str]] = {}
  entry, cur = "", None
  for line in text.split("\n"):
    m = re.match(r"^(ENTRY )?%(\S+) ", line)
    if m and line.rstrip().endswith("{"):
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
    elif cur is not None:
      comps[cur].append(line)
  return comps, entry


def param_ops(text: str, shapes: Sequence[Sequence[int]]
              ) -> dict[str, dict[str, int]]:
  """Parameter-sized instructions outside and inside conditional branches.

  Args:
    text: Compiled HLO text.
    shapes: Buffer shapes to count (the parameters' shapes).

  Returns:
    ``{where: {op: n}}`` for ``where`` in :data:`WHERE` and ``op`` in
    :data:`OPS` (a ``broadcast`` counts only when it broadcasts a scalar,
    i.e. fills a buffer). Each computation is counted once, however often
    it is called.
  """
  comps, entry = computations(text)
  wanted = {",".join(str(int(d)) for d in s) for s in shapes}
  out = {k: collections.Counter() for k in WHERE}
  seen: set[tuple[str, str]] = set()
  stack = [(entry, "once")]
  while stack:
    name, where = stack.pop()
    if (name, where) in seen or name not in comps:
      continue
    seen.add((name, where))
    for line in comps[name]:
      m = _INSTR.search(line)
      if m and m.group(2) in wanted and m.group(3) in OPS:
        if m.group(3) != "broadcast" or "dimensions={}" in line:
          out[where][m.group(3)] += 1
      for kind, callee in _CALLS.findall(line):
        inner = where
        if kind == "body=":
          inner = where.replace("once", "loop")
        stack.append((callee.lstrip("%"), inner))
      b = _BRANCHES.search(line)
      if b:
        inner = where.split("_")[0] + "_branches"
        stack.extend((x.strip().lstrip("%"), inner)
                     for x in b.group(1).split(","))
  return {k: {op: int(v[op]) for op in OPS} for k, v in out.items()}


# --- where the HLO's bulk sits: segment kinds and kernel copies --------------

_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPCODE = re.compile(r"= [^=]*?\b([a-z][\w\-]*)\(")
_KERNEL = re.compile(r"tj_kernel/k(\d+)/")
SEGMENTS = ("tj_seg_ticks", "tj_seg_loop", "tj_seg_interp")
HEAVY = ("dot", "convolution")


def segment_chars(text: str) -> dict[str, int]:
  """Characters of instruction lines per segment kind.

  An instruction belongs to the segment kind (``passes.lower``'s
  ``SEGMENT_SCOPES``) named in its ``op_name``; ``"outside"``: lines with
  metadata naming none (packing, the final sums, the sink), ``"untagged"``:
  lines without ``op_name`` (fusion parameters, tuples, copies XLA added).
  """
  out = {k: 0 for k in SEGMENTS + ("outside", "untagged")}
  for line in text.split("\n"):
    if " = " not in line:
      continue
    m = _OP_NAME.search(line)
    if m is None:
      out["untagged"] += len(line)
      continue
    kind = next((s for s in SEGMENTS if s in m.group(1)), "outside")
    out[kind] += len(line)
  return out


def kernel_heavy_ops(text: str) -> dict[int, int]:
  """Kernel id -> ``dot`` and ``convolution`` instructions of its scope
  (``tj_kernel/k<id>``) in the whole module; each copy of a kernel body
  in the program (a switch branch, an unrolled tick) adds its own."""
  out: collections.Counter = collections.Counter()
  for line in text.split("\n"):
    m = _OPCODE.search(line)
    if m is None or m.group(1) not in HEAVY:
      continue
    k = _KERNEL.search(line)
    if k is not None:
      out[int(k.group(1))] += 1
  return dict(out)


def kernel_copies(text: str, per_copy: dict[int, int]) -> dict[int, float]:
  """Kernel id -> copies of its body in the module: its ``dot`` and
  ``convolution`` instructions over those of one copy (``per_copy``, e.g.
  from the kernel's jaxpr); kernels without such ops are left out."""
  heavy = kernel_heavy_ops(text)
  return {k: round(heavy.get(k, 0) / n, 2) for k, n in sorted(per_copy.items())
          if n}
