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

Nothing read back is trusted: every record is checked against the schema of
its kind (:data:`SCHEMAS`: field types, finite positive times below
``MAX_SECONDS``, non-negative bytes). A record that does not parse, has the
wrong key or breaks its schema is logged (with its file path) on the
``tessel_jax.cost`` logger, removed, and counts as a miss, so the caller
measures again and stores a good record. Concurrent processes each write
their own temporary file and rename it over the record: a reader sees the
old record, the new one or none, never a mix.

``python -m tessel_jax.cost --list`` lists the records, ``--clear`` removes
them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

ENV_DIR = "TESSEL_JAX_CACHE"
FORMAT = 4  # bump when the stored records change meaning


def default_dir() -> str:
  """``$TESSEL_JAX_CACHE`` or ``~/.cache/tessel_jax``."""
  env = os.environ.get(ENV_DIR)
  if env:
    return os.path.expanduser(env)
  return os.path.join(os.path.expanduser("~"), ".cache", "tessel_jax")


T = TypeVar("T")
_LOG = logging.getLogger("tessel_jax.cost")

#: Largest seconds a cached timing may hold (a kernel or tick slower than
#: this is a corrupt record; larger figures stall ``predict``).
MAX_SECONDS = 1e4
#: Largest byte count a cached record may hold.
MAX_BYTES = 2**62


def _seconds(v: Any) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v) and 0 < v <= MAX_SECONDS)


def _seconds0(v: Any) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v) and 0 <= v <= MAX_SECONDS)


def _bytes(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_BYTES


def _rate(v: Any) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool)
          and math.isfinite(v) and v > 0)


def _cores(v: Any) -> bool:
  return v is None or (isinstance(v, int) and not isinstance(v, bool)
                       and v >= 1)


#: Required fields and their checks, per record kind (other kinds: only the
#: key is checked).
SCHEMAS: dict[str, dict[str, Callable[[Any], bool]]] = {
    "kernel": {"seconds": _seconds, "core_seconds": _seconds,
               "raw_seconds": _seconds, "temp_bytes": _bytes,
               "compile_seconds": _seconds0, "host_cores": _cores},
    "ticks": {"fixed_s": _seconds0, "per_byte_s": _seconds0},
    "link": {"latency_s": _seconds0, "bandwidth_bytes_per_s": _rate},
    "group": {"seconds": _seconds0},   # passes.autocut_cost timings
    "standin": {"standin_s": _seconds},
    "ports": {"per_port_s": _seconds0, "standin_s": _seconds,
              "tick_ports": _seconds0},
    "portsplan": {"per_port_s": _seconds0, "standin_s": _seconds},
    "outside": {"outside_s": _seconds0},   # cost.outside
}


def schema_problem(kind: str, record: Any, key: str) -> str | None:
  """What is wrong with ``record`` for ``kind`` and ``key`` (None: fine)."""
  if not isinstance(record, dict):
    return f"a {type(record).__name__}, not a JSON object"
  if record.get("key") != key:
    return "a record for another key"
  for field, ok in SCHEMAS.get(kind, {}).items():
    if field not in record:
      return f"no {field!r} field"
    if not ok(record[field]):
      return f"{field}={record[field]!r:.40} out of range or of the wrong type"
  return None


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
    misses: Keys not found (or ignored because of ``reprofile``, or bad).
    dropped: Paths of bad records removed since creation.
  """

  def __init__(self, directory: str | None = None, reprofile: bool = False):
    self.directory = os.path.expanduser(directory or default_dir())
    self.reprofile = bool(reprofile)
    self.hits = 0
    self.misses = 0
    self.dropped: list[str] = []

  def path(self, kind: str, key: str) -> str:
    return os.path.join(self.directory, f"{kind}-{key}.json")

  def has(self, kind: str, key: str) -> bool:
    """Whether a record is stored for ``key`` (not read, not checked, no
    hit or miss counted; False under ``reprofile``)."""
    return not self.reprofile and os.path.exists(self.path(kind, key))

  def get(self, kind: str, key: str) -> dict[str, Any] | None:
    """The record stored for ``key`` (None: absent, bad or reprofile).

    A record that does not parse or breaks its kind's schema is logged with
    its path and removed; the caller measures again.
    """
    if self.reprofile:
      self.misses += 1
      return None
    path = self.path(kind, key)
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except OSError:
      self.misses += 1
      return None
    try:
      record = json.loads(text, parse_constant=_no_constant)
    except ValueError as err:
      problem = f"not JSON ({err})"
    else:
      problem = schema_problem(kind, record, key)
    if problem is not None:
      self.discard(path, problem)
      self.misses += 1
      return None
    self.hits += 1
    return record

  def decoded(self, kind: str, key: str, decode: Callable[[dict[str, Any]], T],
              what: str) -> T | None:
    """``decode(record)`` of the record stored for ``key``, or None.

    For stores of derived results (schedules, frontiers) on this cache:
    a record ``decode`` refuses (``KeyError``, ``TypeError`` or
    ``ValueError``) is logged as a malformed ``what`` record and removed.

    Args:
      kind: The record kind (the file name's prefix).
      key: The record's key.
      decode: Builds the result from the record; may return None for a
        record that is sound but does not answer (kept on disk).
      what: Names the record in the log line ("schedule", "frontier").
    """
    record = self.get(kind, key)
    if record is None:
      return None
    try:
      return decode(record)
    except (KeyError, TypeError, ValueError) as err:
      self.discard(self.path(kind, key), f"malformed {what} record ({err})")
      return None

  def discard(self, path: str, problem: str) -> None:
    """Logs and removes a bad record (another process may have already)."""
    _LOG.warning("tessel_jax cost cache: dropping %s: %s; it will be"
                 " measured again", path, problem)
    self.dropped.append(path)
    try:
      os.remove(path)
    except OSError:
      pass

  def put(self, kind: str, key: str, record: Mapping[str, Any]) -> None:
    """Stores ``record`` under ``key`` (best effort: an unwritable directory
    only costs the next run a re-measurement).

    A record that breaks its kind's schema (e.g. a NaN timing) is logged
    and not stored.
    """
    data = dict(record)
    data["key"] = key
    problem = schema_problem(kind, data, key)
    if problem is not None:
      _LOG.warning("tessel_jax cost cache: not storing a bad %s record: %s",
                   kind, problem)
      return
    tmp = None
    try:
      os.makedirs(self.directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-",
                                 suffix=".json")
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True, allow_nan=False)
      os.replace(tmp, self.path(kind, key))
      tmp = None
    except OSError:
      pass
    finally:
      if tmp is not None:
        try:
          os.remove(tmp)
        except OSError:
          pass

  def entries(self) -> list[tuple[str, int]]:
    """``(path, size in bytes)`` of every record, sorted by path."""
    out = []
    for path in sorted(glob.glob(os.path.join(self.directory, "*-*.json"))):
      try:
        out.append((path, os.path.getsize(path)))
      except OSError:
        pass
    return out

  def clear(self) -> int:
    """Removes every record (and stale temporary files); returns how many
    records were removed."""
    removed = 0
    for path, _ in self.entries():
      try:
        os.remove(path)
        removed += 1
      except OSError:
        pass
    for path in glob.glob(os.path.join(self.directory, ".tmp-*.json")):
      try:
        os.remove(path)
      except OSError:
        pass
    return removed


def _no_constant(name: str) -> Any:
  raise ValueError(f"holds {name}")
