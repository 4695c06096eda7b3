"""Inspect or empty the measurement cache.

  python -m tessel_jax.cost --list            # one line per record
  python -m tessel_jax.cost --clear           # remove every record
  python -m tessel_jax.cost --list --dir=PATH # another cache directory

The directory defaults to ``$TESSEL_JAX_CACHE`` or ``~/.cache/tessel_jax``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tessel_jax.cost import cache as _cache


def _describe(path: str) -> str:
  """``kind  label  seconds`` of one record, or why it cannot be read."""
  kind = os.path.basename(path).split("-", 1)[0]
  try:
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError) as err:
    return f"{kind:7s} unreadable ({err})"
  key = os.path.basename(path)[len(kind) + 1:-len(".json")]
  problem = _cache.schema_problem(kind, record, key)
  label = record.get("label", "") if isinstance(record, dict) else ""
  if problem is not None:
    return f"{kind:7s} {label:12s} BAD: {problem}"
  if kind == "kernel":
    return f"{kind:7s} {label:12s} {record['seconds'] * 1e3:.4f} ms"
  return f"{kind:7s} {label:12s}"


def main(argv: list[str] | None = None) -> int:
  """Runs the command line; returns the exit code."""
  parser = argparse.ArgumentParser(
      prog="python -m tessel_jax.cost",
      description="List or clear the tessel_jax measurement cache.")
  parser.add_argument("--list", action="store_true", help="list records")
  parser.add_argument("--clear", action="store_true",
                      help="remove every record")
  parser.add_argument("--dir", default=None,
                      help="cache directory (default: $TESSEL_JAX_CACHE or"
                      " ~/.cache/tessel_jax)")
  args = parser.parse_args(argv)
  if args.list == args.clear:
    print("error: give exactly one of --list or --clear", file=sys.stderr)
    return 1
  store = _cache.ProfileCache(args.dir)
  if args.clear:
    print(f"removed {store.clear()} records from {store.directory}")
    return 0
  entries = store.entries()
  for path, size in entries:
    print(f"{_describe(path)}  {size:6d} B  {os.path.basename(path)}")
  print(f"{len(entries)} records in {store.directory}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
