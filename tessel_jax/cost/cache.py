"""On-disk JSON cache of measurements, keyed by what the measurement depends on.

One file per key (``<dir>/<kind>-<sha256>.json``), written atomically
(temporary file + ``os.replace``) so concurrent runs never read half a file.
The key is the SHA-256 of a canonical JSON of everything that decides the
result: for a kernel its jaxpr text, input and parameter shapes and dtypes,
the backend and the device kind, plus the JAX version and the XLA flags that
change speed (see ``measure.kernel_key``). A changed kernel, shape or
backend therefore misses and is measured again; nothing ever needs to be
invalidated by hand (``reprofile=True`` forces re-measurement anyway).

The directory is ``$TESSEL_JAX_CACHE`` when set, else
``~/.cache/tessel_jax``. No jax import here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

ENV_DIR = "TESSEL_JAX_CACHE"
FORMAT = 4  # bump when the stored records change meaning


def default_dir() -> str:
  """``$TESSEL_JAX_CACHE`` or ``~/.cache/tessel_jax``."""
  env = os.environ.get(ENV_DIR)
  if env:
    return os.path.expanduser(env)
  return os.path.join(os.path.expanduser("~"), ".cache", "tessel_jax")


def make_key(fields: Mapping[str, Any]) -> str:
  """SHA-256 hex digest of a canonical JSON of ``fields`` (and the format)."""
  text = json.dumps({"format": FORMAT, **fields}, sort_keys=True,
                    separators=(",", ":"), default=str)
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ProfileCache:
  """Measurements on disk, one JSON record per key.

  Args:
    directory: Where the records live (None: :func:`default_dir`). Created on
      the first write.
    reprofile: Ignore stored records (every ``get`` misses); new
      measurements still overwrite them.

  Attributes:
    hits: Keys answered from disk since creation.
    misses: Keys not found (or ignored because of ``reprofile``).
  """

  def __init__(self, directory: str | None = None, reprofile: bool = False):
    self.directory = os.path.expanduser(directory or default_dir())
    self.reprofile = bool(reprofile)
    self.hits = 0
    self.misses = 0

  def path(self, kind: str, key: str) -> str:
    return os.path.join(self.directory, f"{kind}-{key}.json")

  def get(self, kind: str, key: str) -> dict[str, Any] | None:
    """The record stored for ``key`` (None: absent, unreadable or reprofile)."""
    if self.reprofile:
      self.misses += 1
      return None
    try:
      with open(self.path(kind, key), encoding="utf-8") as f:
        record = json.load(f)
    except (OSError, ValueError):
      self.misses += 1
      return None
    if not isinstance(record, dict) or record.get("key") != key:
      self.misses += 1
      return None
    self.hits += 1
    return record

  def put(self, kind: str, key: str, record: Mapping[str, Any]) -> None:
    """Stores ``record`` under ``key`` (best effort: an unwritable directory
    only costs the next run a re-measurement)."""
    data = dict(record)
    data["key"] = key
    try:
      os.makedirs(self.directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-",
                                 suffix=".json")
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
      os.replace(tmp, self.path(kind, key))
    except OSError:
      pass
