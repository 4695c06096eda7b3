"""The runners' ``*_args`` modules agree with their ``*_lib`` modules.

An ``*_args`` module defines its flags without importing its lib (so that
``--help`` imports no jax, CP-SAT or matplotlib): its flag defaults and the
names its flags list are written out, and the lib holds the same values as
its arguments' defaults (``XArgs()``) and its constants. These tests read
each ``*_args`` module's source (importing several into one process would
define clashing flags) and compare it with the lib, so the two cannot drift.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import re
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARGS = sorted(p.stem for p in (ROOT / "experiments").glob("*_args.py"))

# (args module, flag, "default" | "enum" | "help", lib module, expression
# of the lib's value): a flag's default list, its enum values, or names its
# help text lists.
CONSTANTS = (
    ("autocut_bench_args", "models", "default", "autocut_bench_lib",
     "list(MODELS)"),
    ("cost_bench_args", "parts", "default", "cost_bench_lib", "list(PARTS)"),
    ("lowering_bench_args", "parts", "default", "lowering_bench_lib",
     "list(DEFAULT_PARTS)"),
    ("tp_bench_args", "configs", "default", "tp_bench_lib", "list(CONFIGS)"),
    ("inference_speedup_args", "placements", "default",
     "inference_speedup_lib", "list(PLACEMENTS)"),
    ("hlo_copies_args", "model", "enum", "hlo_copies_lib", "list(MODELS)"),
    ("model_zoo_args", "models", "default", "model_zoo_models",
     "list(BUILDERS)"),
    ("model_zoo_args", "placements", "default", "model_zoo_lib",
     "list(PLACEMENTS)"),
    ("model_zoo_args", "modes", "default", "model_zoo_lib", "list(MODES)"),
    ("frontier_args", "cost_source", "enum", "frontier_lib",
     "list(COST_SOURCES)"),
    ("frontier_args", "placements", "help", "frontier_lib",
     "list(frontier.SUPPORTED)"),
    ("frontier_args", "model", "help", "frontier_lib",
     "list(frontier.PRESETS)"),
    ("search_scaling_args", "time_limit_memory", "enum",
     "search_scaling_lib", "list(MEMORY_CASES)"),
    ("compare_schedules_args", "memories", "help", "compare_schedules_lib",
     "list(MEMORY_CASES)"),
    ("peer_bench_args", "variants", "help", "peer_bench_lib",
     "list(DEFAULT_VARIANTS[2]) + list(DEFAULT_VARIANTS[4])"),
)


def _tree(module: str) -> ast.Module:
  return ast.parse((ROOT / "experiments" / f"{module}.py").read_text())


def _flags(module: str) -> dict[str, ast.Call]:
  """The module's ``flags.DEFINE_*`` calls by flag name."""
  out = {}
  for node in ast.walk(_tree(module)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and node.args
        and isinstance(node.args[0], ast.Constant)):
      out[node.args[0].value] = node
  return out


def _help(call: ast.Call) -> str:
  """The help text of a DEFINE call (its last string argument)."""
  texts = [a for a in call.args if isinstance(a, (ast.Constant,
                                                   ast.JoinedStr))]
  return "".join(v.value for v in ast.walk(texts[-1])
                 if isinstance(v, ast.Constant) and isinstance(v.value, str))


def _typed_args(module: str) -> tuple[str, str] | None:
  """(lib, class) of the ``if TYPE_CHECKING:`` import of the arguments."""
  for node in _tree(module).body:
    if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"):
      for imp in node.body:
        if isinstance(imp, ast.ImportFrom) and imp.module.endswith("_lib"):
          return imp.module, imp.names[0].name
  return None


def _as_flag(value: Any) -> Any:
  """A lib default as its flag writes it (sequences: lists of strings)."""
  if isinstance(value, (tuple, list)):
    return [f"{v:g}" if isinstance(v, float) else str(v) for v in value]
  return value


def _literal(node: ast.AST) -> tuple[bool, Any]:
  try:
    return True, ast.literal_eval(node)
  except ValueError:
    return False, None


# Flags whose default the lib holds parsed: (args module, flag) -> the lib's
# parser.
PARSED = {("frontier_args", "memory_limit"): "parse_bytes"}


def _compare(module: str) -> tuple[int, list[str]]:
  """How many flag defaults were compared with the lib's, and the ones that
  differ."""
  lib, cls = _typed_args(module)
  libmod = importlib.import_module(lib)
  defaults = getattr(libmod, cls)()
  fields = {f.name for f in dataclasses.fields(defaults)} if (
      dataclasses.is_dataclass(defaults)) else set(defaults._fields)
  compared, bad = 0, []
  for name, call in _flags(module).items():
    if name not in fields or len(call.args) < 2:
      continue
    known, flag_default = _literal(call.args[1])
    lib_default = getattr(defaults, name)
    if not known or flag_default is None or lib_default is None:
      continue  # computed, or None on one side (from_flags maps it)
    if (module, name) in PARSED:
      flag_default = getattr(libmod, PARSED[module, name])(flag_default)
    elif isinstance(flag_default, str) and not isinstance(lib_default, str):
      lib_default = str(lib_default)  # a DEFINE_enum of numbers
    compared += 1
    if flag_default != _as_flag(lib_default):
      bad.append(f"{module} --{name} defaults to {flag_default!r},"
                 f" {lib}.{cls}() to {lib_default!r}")
  return compared, bad


LAZY = [m for m in ARGS if _typed_args(m)]


def test_every_lazy_args_module_is_checked():
  assert len(LAZY) >= 18, LAZY
  assert sum(_compare(m)[0] for m in LAZY) >= 100
  assert {m for m, *_ in CONSTANTS} <= set(ARGS)


@pytest.mark.parametrize("module", LAZY)
def test_flag_defaults_equal_the_lib_defaults(module):
  assert not _compare(module)[1]


@pytest.mark.parametrize("entry", CONSTANTS, ids=lambda e: f"{e[0]}-{e[1]}")
def test_flag_lists_equal_the_lib_constants(entry):
  module, name, where, lib, expr = entry
  call = _flags(module)[name]
  namespace = dict(vars(importlib.import_module(f"experiments.{lib}")))
  if lib == "frontier_lib":
    namespace["frontier"] = importlib.import_module(
        "tessel_jax.search.frontier")
  expected = eval(expr, namespace)  # pylint: disable=eval-used
  if where == "default":
    assert ast.literal_eval(call.args[1]) == expected
  elif where == "enum":
    assert ast.literal_eval(call.args[2]) == expected
  else:
    words = set(re.findall(r"[\w-]+", _help(call)))
    missing = [v for v in expected if v not in words]
    assert not missing, f"{module} --{name}'s help lacks {missing}"
