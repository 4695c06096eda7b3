"""Result files of the evaluation runners: ``<output_dir>/run_{hash}.json``.

Every evaluation runner (``search_scaling``, ``compare_schedules``, ...)
writes one JSON object per run into its output folder, named by a short hash
of the arguments that change its results, so the same command rewrites the
same file and different commands never collide. The object always has
``runner`` (which runner wrote it; ``plot_results`` dispatches on it),
``args``, ``environment`` and ``output`` (its own path). Nothing here reads
flags.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
from collections.abc import Callable
from typing import Any

#: Argument fields that only say where to write, so never change the hash.
PATH_FIELDS = ("output_dir",)


def write_text(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` atomically, creating its folder."""
  folder = os.path.dirname(path)
  if folder:
    os.makedirs(folder, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def args_hash(args: Any) -> str:
  """Short stable hash (12 hex digits) of ``args`` less its path fields.

  Args:
    args: A runner's NamedTuple of arguments.
  """
  fields = {k: v for k, v in args._asdict().items() if k not in PATH_FIELDS}
  text = json.dumps(fields, sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:12]


def run_path(args: Any) -> str:
  """``<args.output_dir>/run_{args_hash(args)}.json``."""
  return os.path.join(args.output_dir, f"run_{args_hash(args)}.json")


def environment() -> dict[str, Any]:
  """The machine a run was made on and when (for BENCHMARKS-style records)."""
  return {
      "python": platform.python_version(),
      "machine": platform.machine(),
      "node": platform.node(),
      "cpu_count": os.cpu_count(),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }


def new_results(runner: str, args: Any) -> dict[str, Any]:
  """The common head of a result object (``runner``, ``args``, ...)."""
  return {"runner": runner, "args": args._asdict(),
          "environment": environment(), "output": run_path(args)}


def write(results: dict[str, Any]) -> str:
  """Writes ``results`` to ``results["output"]`` atomically; returns it."""
  path = results["output"]
  write_text(path, json.dumps(results, indent=1) + "\n")
  return path


def write_record(path: str, record: dict[str, Any], table: str) -> None:
  """Writes a benchmark's ``record`` as JSON to ``path`` (atomically,
  creating its folder) and its markdown ``table`` beside it as ``.md``."""
  write_text(path, json.dumps(record, indent=1) + "\n")
  write_text(os.path.splitext(path)[0] + ".md", table + "\n")


def read(path: str) -> dict[str, Any]:
  """Reads a result file back.

  Raises:
    ValueError: if the file is not a runner's result object.
  """
  with open(path) as f:
    data = json.load(f)
  if not isinstance(data, dict) or "runner" not in data:
    raise ValueError(f"{path} is not a result file of an evaluation runner"
                     " (no 'runner' field)")
  return data


def plot_file(path: str, runner: str,
              plot: Callable[[dict[str, Any], str], list[str]],
              output_dir: str | None = None) -> list[str]:
  """Reads ``runner``'s result file and draws it with ``plot(results,
  stem)`` next to it (or in ``output_dir``); returns the pictures' paths.

  Raises:
    ValueError: if the file is not ``runner``'s result.
  """
  results = read(path)
  if results["runner"] != runner:
    raise ValueError(f"{path} was written by {results['runner']!r}, not by"
                     f" experiments.{runner}")
  stem = os.path.splitext(path)[0]
  if output_dir:
    os.makedirs(output_dir, exist_ok=True)
    stem = os.path.join(output_dir, os.path.basename(stem))
  return plot(results, stem)
