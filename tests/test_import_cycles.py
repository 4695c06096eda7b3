"""No import cycles among the modules of ``tessel_jax/`` and ``passes/``.

Imports are read from the source with ``ast`` (nothing is imported).
``passes`` is installed as ``tessel_jax.passes``; both spellings name the
same module. Imports under ``if TYPE_CHECKING:`` are annotations only and
do not count.

* Import time: the imports a module runs when it is loaded (module level,
  including ``try``/``except`` import fallbacks) form no cycle at all.
* Every import, function-level ones included: the only cycles are the
  known ones (``KNOWN_LAZY_CYCLES``). ``placement="auto"``: the step asks
  ``auto``, which prices plans (``plans``), each a ``tj.schedule`` step
  (made in ``frontier_step``).
  Any other cycle fails, so a new one is a deliberate decision.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parent.parent
KNOWN_LAZY_CYCLES = (
    frozenset({"tessel_jax.api", "tessel_jax.auto", "tessel_jax.frontier_step",
               "tessel_jax.plans", "tessel_jax.scheduled"}),
)


def module_files(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for ``tessel_jax/**`` and ``passes/*``."""
  out = {}
  for pkg in ("tessel_jax", "passes"):
    for path in sorted((root / pkg).rglob("*.py")):
      parts = list(path.relative_to(root).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out[".".join(parts)] = path
  return out


def _canonical(name: str) -> str:
  if name == "tessel_jax.passes" or name.startswith("tessel_jax.passes."):
    return "passes" + name[len("tessel_jax.passes"):]
  return name


def _statements(body: list[ast.stmt], lazy: bool) -> Iterator[ast.stmt]:
  """Import statements in ``body``: module level (``lazy``: at any depth),
  leaving out ``if TYPE_CHECKING:`` blocks."""
  for stmt in body:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
      yield stmt
    elif isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(
        stmt.test):
      yield from _statements(stmt.orelse, lazy)
    elif isinstance(stmt, (ast.If, ast.Try, ast.With)) or (
        lazy and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef,
                                   ast.ClassDef, ast.For, ast.While))):
      for field in ("body", "orelse", "finalbody"):
        yield from _statements(getattr(stmt, field, []), lazy)
      for handler in getattr(stmt, "handlers", []):
        yield from _statements(handler.body, lazy)


def _targets(stmt: ast.stmt, package: str) -> list[str]:
  """The dotted names an import statement reaches (relative ones resolved
  against ``package``)."""
  if isinstance(stmt, ast.Import):
    return [_canonical(a.name) for a in stmt.names]
  base = stmt.module or ""
  if stmt.level:
    anchor = package.split(".")[:len(package.split(".")) - stmt.level + 1]
    base = ".".join(anchor + ([base] if base else []))
  base = _canonical(base)
  return [_canonical(f"{base}.{a.name}") for a in stmt.names] + [base]


def import_graph(files: Mapping[str, pathlib.Path],
                 lazy: bool) -> dict[str, set[str]]:
  """Module -> the modules of ``files`` it imports."""
  graph = {}
  for mod, path in files.items():
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    deps = set()
    for stmt in _statements(ast.parse(path.read_text()).body, lazy):
      targets = _targets(stmt, package)
      if isinstance(stmt, ast.ImportFrom):  # `from a import b`: b or a
        targets = [t for t in targets[:-1] if t in files] or targets[-1:]
      for name in targets:
        while name and name not in files:
          name = name.rpartition(".")[0]
        if name and name != mod:
          deps.add(name)
    graph[mod] = deps
  return graph


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
  """Strongly connected components with more than one module."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = set()
      while True:
        w = stack.pop()
        comp.add(w)
        if w == v:
          break
      if len(comp) > 1:
        found.append(frozenset(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_cycle_at_import_time():
  files = module_files(ROOT)
  assert len(files) > 60 and "passes.plan" in files
  found = cycles(import_graph(files, lazy=False))
  assert not found, f"import cycles: {[sorted(c) for c in found]}"


def test_only_the_known_cycle_with_function_level_imports():
  found = cycles(import_graph(module_files(ROOT), lazy=True))
  new = [sorted(c) for c in found if c not in KNOWN_LAZY_CYCLES]
  assert not new, f"import cycles (function-level imports included): {new}"


def test_named_pairs_are_not_cycles():
  graph = import_graph(module_files(ROOT), lazy=True)
  for a, b in (("passes.plan", "passes.interp"),
               ("passes.plan_ir", "passes.segments"),
               ("tessel_jax.api", "tessel_jax.scheduled")):
    assert not (b in graph[a] and a in graph[b]), (a, b)


def test_finds_a_cycle(tmp_path):
  pkg = tmp_path / "tessel_jax"
  (pkg / "sub").mkdir(parents=True)
  (tmp_path / "passes").mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from tessel_jax.sub import b\n")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "sub" / "b.py").write_text(
      "try:\n  from tessel_jax.passes import c\nexcept ImportError:\n"
      "  from passes import c\n")
  (tmp_path / "passes" / "__init__.py").write_text("")
  (tmp_path / "passes" / "c.py").write_text(
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
      "  from . import d\n\ndef f():\n  from tessel_jax import a\n")
  (tmp_path / "passes" / "d.py").write_text("from .c import f\n")
  files = module_files(tmp_path)
  assert cycles(import_graph(files, lazy=False)) == []
  assert cycles(import_graph(files, lazy=True)) == [
      frozenset({"tessel_jax.a", "tessel_jax.sub.b", "passes.c"})]
  (pkg / "a.py").write_text("import tessel_jax.sub.b\nimport passes.c\n")
  (tmp_path / "passes" / "c.py").write_text("from tessel_jax import a\n")
  (pkg / "sub" / "b.py").write_text("import numpy\n")
  assert cycles(import_graph(module_files(tmp_path), lazy=False)) == [
      frozenset({"tessel_jax.a", "passes.c"})]
