"""Where a compiled HLO module's text goes, per kind, and its distinct kernels.

``parts(text)`` splits ``compiled.as_text()`` into characters per kind:
the op metadata (``metadata={...}``: op names and source frame ids), the
source tables (``FileNames`` .. ``StackFrames``), and the rest (the
instructions themselves) by the computation it sits in (the entry, while
loop bodies and conditions, conditional branches, fused computations) and,
outside fusions, by line kind (loop plumbing: ``get-tuple-element``,
``tuple``, ``while``, ``parameter``, ``copy``, ``bitcast``, ``constant``;
calls of fused kernels; other ops; computation headers). Fused
computations are split by what they compute: scalar (their result is a
scalar: table lookups, counters, order tokens), fills (a broadcast alone),
stash writes (a ``dynamic-update-slice``), the rest (kernels, stash reads).

``distinct_fusions(text)`` lists the fused computations that differ in more
than their names (metadata, backend configs and names dropped): XLA's CPU
compiler compiles identical ones once, and compile time follows the number
of distinct ones (``BENCHMARKS.md``, "Compile: fewer distinct XLA kernels").
Used by ``experiments.peer_compile`` and ``tests/test_hlo_size.py``.
"""

from __future__ import annotations

import collections
import re
from typing import Any

_METADATA = re.compile(r", metadata=\{[^}]*\}")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(")
_NAME = re.compile(r"%[\w.\-]+")
_OPCODE = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?\b([a-z][\w\-]*)\(")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_PLUMBING = frozenset({"get-tuple-element", "tuple", "while", "parameter",
                       "copy", "bitcast", "constant"})


def _blocks(text: str) -> list[tuple[str, str]]:
  """``(name, block text)`` of each computation or table of the module."""
  out = []
  for block in text.split("\n\n"):
    first = block.strip().split("\n", 1)[0]
    m = _HEADER.match(first)
    name = m.group(2) if m else first.split(" ", 1)[0]
    out.append((name, block))
  return out


def _roles(text: str) -> dict[str, str]:
  """Computation name -> role: ``entry``, ``while_body``, ``while_cond``,
  ``branch``, ``fusion`` or ``other`` (reducers and the like)."""
  roles: dict[str, str] = {}
  for line in text.split("\n"):
    if line.startswith("ENTRY "):
      roles[_HEADER.match(line).group(2)] = "entry"
    for kind, callee in re.findall(r"(body|condition|calls)=%?([\w.\-]+)",
                                   line):
      roles[callee] = {"body": "while_body", "condition": "while_cond",
                       "calls": "fusion"}[kind]
    b = re.search(r"branch_computations=\{([^}]*)\}", line)
    if b:
      for x in b.group(1).split(","):
        roles[x.strip().lstrip("%")] = "branch"
  return roles


def _fusion_kind(block: str) -> str:
  """What a fused computation computes (see the module docstring)."""
  root = next((l for l in block.split("\n") if "ROOT " in l), "")
  if re.search(r"= (s32|u32|pred|f32)\[\]", root):
    return "scalar"
  ops = {m.group(1) for l in block.split("\n")[1:]
         for m in [_OPCODE.match(l)] if m} - {"parameter", "constant",
                                               "bitcast"}
  if ops <= {"broadcast"}:
    return "fill"
  if "dynamic-update-slice" in ops:
    return "stash_write"
  return "compute"


def parts(text: str) -> dict[str, int]:
  """Characters of ``text`` per kind (they sum to ``len(text)`` less the
  two newlines between each computation and the next)."""
  out: collections.Counter = collections.Counter()
  roles = _roles(text)
  for name, block in _blocks(text):
    if name in _TABLES or name == "HloModule":
      out["header_and_source_tables"] += len(block)
      continue
    md = sum(len(m) for m in _METADATA.findall(block))
    out["metadata"] += md
    bare = _METADATA.sub("", block)
    role = roles.get(name, "other")
    if role == "fusion":
      out[f"fusion:{_fusion_kind(bare)}"] += len(bare)
      continue
    lines = bare.split("\n")
    for i, line in enumerate(lines):
      m = _OPCODE.match(line)
      op = m.group(1) if m else ""
      if i == 0 or not m:
        kind = "headers"
      elif op in _PLUMBING or " while(" in line or " tuple(" in line:
        kind = "plumbing"
      elif op == "fusion":
        kind = "fusion_calls"
      else:
        kind = "ops"
      out[f"{role}:{kind}"] += len(line) + (i + 1 < len(lines))
  return dict(out)


def distinct_fusions(text: str) -> list[list[str]]:
  """Fused computations grouped by content (names, metadata and backend
  configs dropped): one list of names per distinct computation."""
  groups: dict[tuple[str, str], list[str]] = {}
  for block in text.split("\n\n"):
    lines = block.strip().split("\n")
    if not re.match(r"%?(fused|wrapped)\S* \(", lines[0]):
      continue
    body = re.sub(r", (metadata|backend_config)=\{.*?\}(?=,|$)", "",
                  "\n".join(lines[1:]), flags=re.M)
    names: dict[str, str] = {}
    body = _NAME.sub(lambda m: names.setdefault(m[0], f"%{len(names)}"),
                     body)
    key = (re.sub(r"[\w.\-]+:", ":", lines[0].split(" ", 1)[1]), body)
    groups.setdefault(key, []).append(lines[0].split(" ", 1)[0])
  return list(groups.values())


def summary(text: str) -> dict[str, Any]:
  """Size, instruction count, while loops, distinct fusions and parts."""
  return {"kchars": round(len(text) / 1000, 1),
          "kchars_no_metadata": round(len(_METADATA.sub("", text)) / 1000, 1),
          "instructions": len(re.findall(r"^\s*(?:ROOT )?%\S+ = ", text,
                                         re.M)),
          "while_loops": text.count(" while("),
          "fusions": sum(1 for l in text.split("\n") if " fusion(" in l),
          "distinct_fusions": len(distinct_fusions(text)),
          "parts": parts(text)}


def parts_table(rows: dict[str, dict[str, Any]]) -> str:
  """Markdown: kchars per part, one column per program (``label ->
  summary``)."""
  labels = list(rows)
  keys = sorted({k for r in rows.values() for k in r["parts"]},
                key=lambda k: -max(r["parts"].get(k, 0)
                                   for r in rows.values()))
  lines = ["| part | " + " | ".join(labels) + " |",
           "|---" * (len(labels) + 1) + "|"]
  for k in keys:
    lines.append(f"| {k} | " + " | ".join(
        f"{rows[l]['parts'].get(k, 0) / 1000:.1f}" for l in labels) + " |")
  for k in ("kchars", "kchars_no_metadata", "instructions", "while_loops",
            "fusions", "distinct_fusions"):
    lines.append(f"| **{k}** | " + " | ".join(str(rows[l][k])
                                              for l in labels) + " |")
  return "\n".join(lines)
