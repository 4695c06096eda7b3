"""Every ```python block of README.md runs as written (CPU, fresh process).

Blocks form chains: a block continues the chain before it unless the line
before it (blank lines aside) is ``<!-- new chain -->``; a continuing block
must say so in its first line (a comment containing "continu"). Each chain
runs in one fresh Python process, with no device count in ``XLA_FLAGS``
(the snippets make their own CPU devices; ``child_env``; a chain that sets
``XLA_FLAGS`` before importing jax starts with its own value and the suite's
optimisation level, ``snippet_env``) and uniform costs (the code is the same; only the
profiling is skipped), in a temporary directory.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
from child_env import child_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
NEW_CHAIN = "<!-- new chain -->"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_chains(text: str) -> list[list[str]]:
  """The README's python blocks grouped into chains, in order."""
  chains: list[list[str]] = []
  for match in _FENCE.finditer(text):
    before = text[:match.start()].rstrip().splitlines()
    new = not chains or (before and before[-1].strip() == NEW_CHAIN)
    if new:
      chains.append([match.group(1)])
    else:
      chains[-1].append(match.group(1))
  return chains


_SETDEFAULT = re.compile(
    r'^os\.environ\.setdefault\("XLA_FLAGS", "([^"]*)"\)$', re.M)
_JAX_IMPORT = re.compile(r"^(?:import|from) (?:jax|tessel_jax)\b", re.M)


def preset_xla_flags(code: str) -> str | None:
  """The ``XLA_FLAGS`` value ``code`` sets with ``os.environ.setdefault``
  before it imports jax or tessel_jax, or None (no such line, or one after
  the import). XLA reads the variable when jax makes its CPU client, after
  the import, so a child started with that value behaves as one that sets
  it itself."""
  match = _SETDEFAULT.search(code)
  first_import = _JAX_IMPORT.search(code)
  if match is None or (first_import is not None and
                       first_import.start() < match.start()):
    return None
  return match.group(1)


def snippet_env(code: str = "") -> dict[str, str]:
  """The environment of a chain: uniform costs and no device count. A chain
  that sets ``XLA_FLAGS`` itself (with ``os.environ.setdefault``, which a
  value from the suite would beat) starts with its own value plus the
  suite's other flags (``child_env``: the XLA optimisation level) where it
  sets them before importing jax (``preset_xla_flags``), else with no
  ``XLA_FLAGS`` at all."""
  env = child_env(TESSEL_JAX_COST="uniform", MPLBACKEND="Agg",
                  PYTHONPATH=str(ROOT))
  if "XLA_FLAGS" in code:
    own = preset_xla_flags(code)
    suite = env.pop("XLA_FLAGS", "")
    if own is not None:
      env["XLA_FLAGS"] = " ".join(f for f in (own, suite) if f)
  return env


CHAINS = readme_chains((ROOT / "README.md").read_text())


def test_readme_has_chains():
  assert len(CHAINS) >= 2
  assert sum(len(c) for c in CHAINS) >= 3


def test_chains_setting_xla_flags_start_with_them_and_the_suite_level():
  """A chain setting ``XLA_FLAGS`` before importing jax starts with that
  value and the suite's optimisation level (compiling as the other chains
  do); set after the import, or not by ``setdefault``, the child gets no
  ``XLA_FLAGS`` and runs exactly as written."""
  setting = [c for c in ("\n".join(ch) for ch in CHAINS) if "XLA_FLAGS" in c]
  assert setting and all(preset_xla_flags(c) for c in setting)
  flag = '"--xla_force_host_platform_device_count=4"'
  first = f'import os\nos.environ.setdefault("XLA_FLAGS", {flag})\nimport jax\n'
  assert preset_xla_flags(first) == flag.strip('"')
  env = snippet_env(first)
  assert env["XLA_FLAGS"].split()[0] == flag.strip('"')
  assert set(env["XLA_FLAGS"].split()[1:]) == set(
      child_env().get("XLA_FLAGS", "").split())
  late = f'import os\nimport jax\nos.environ.setdefault("XLA_FLAGS", {flag})\n'
  assert preset_xla_flags(late) is None and "XLA_FLAGS" not in snippet_env(late)
  other = 'import os\nos.environ["XLA_FLAGS"] = "--x"\nimport jax\n'
  assert preset_xla_flags(other) is None and "XLA_FLAGS" not in snippet_env(other)


@pytest.mark.parametrize("index", range(len(CHAINS)))
def test_continuations_say_so(index):
  for block in CHAINS[index][1:]:
    assert "continu" in block.splitlines()[0].lower(), (
        f"README chain {index}: a block continuing the one before must say"
        f" so in its first line, got {block.splitlines()[0]!r}")


_IMPORT = re.compile(r"^(?:import|from) (\w+)", re.M)


def missing_modules(code: str) -> list[str]:
  """Top-level modules ``code`` imports that are not installed (the optional
  ``models`` extra: optax, flax ...)."""
  return sorted({m for m in _IMPORT.findall(code)
                 if importlib.util.find_spec(m) is None})


@pytest.mark.parametrize("index", range(len(CHAINS)))
def test_readme_chain_runs(index, tmp_path):
  code = "\n".join(CHAINS[index])
  if missing_modules(code):
    pytest.skip(f"needs {', '.join(missing_modules(code))} (pip install"
                " -e '.[models]')")
  proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                        env=snippet_env(code), capture_output=True, text=True,
                        timeout=600, check=False)
  assert proc.returncode == 0, (
      f"README chain {index} failed:\n{code}\n--- stderr ---\n"
      f"{proc.stderr[-4000:]}")
