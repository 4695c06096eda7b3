"""Every ```python block of README.md runs as written (CPU, fresh process).

Blocks form chains: a block continues the chain before it unless the line
before it (blank lines aside) is ``<!-- new chain -->``; a continuing block
must say so in its first line (a comment containing "continu"). Each chain
runs in one fresh Python process, with no device count in ``XLA_FLAGS``
(the snippets make their own CPU devices; ``child_env``) and uniform costs (the code is the same; only the
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


def snippet_env(code: str = "") -> dict[str, str]:
  """The environment of a chain: uniform costs and no device count; no
  ``XLA_FLAGS`` at all for a chain that sets them itself (with
  ``os.environ.setdefault``, which a value from the suite would beat)."""
  env = child_env(TESSEL_JAX_COST="uniform", MPLBACKEND="Agg",
                  PYTHONPATH=str(ROOT))
  if "XLA_FLAGS" in code:
    env.pop("XLA_FLAGS", None)
  return env


CHAINS = readme_chains((ROOT / "README.md").read_text())


def test_readme_has_chains():
  assert len(CHAINS) >= 2
  assert sum(len(c) for c in CHAINS) >= 3


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
