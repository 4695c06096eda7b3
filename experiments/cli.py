"""Start-up shared by the runners: ``--help`` that helps, quiet JAX logs.

Every runner ends with ``cli.run(main)`` instead of ``absl.app.run(main)``:

* ``--help`` (also ``-h``, ``-?``, ``--helpshort``) prints the runner's
  docstring and its own flags (the ``*_args`` module's flags, adopted as key
  flags by the binary) and exits 0; absl's own exits 1.
* JAX's backend probe (``Unable to initialize backend 'tpu'`` and the like,
  logged at INFO when a machine lacks that accelerator) is filtered out of
  the log; every other line passes.
* A user error never prints a traceback: a bad flag value, a usage error, a
  bad placement or input (``tessel_jax.checks.InputError`` and its
  subclasses, ``TesselError``), an unreadable or unwritable file or a search
  that found nothing in time prints ONE line ``error: ...`` on stderr and
  exits 1; no schedule under the memory limit prints one line
  ``infeasible: ...`` and exits 2. Anything else is a bug and keeps its
  traceback.

``check_output`` checks an output path's directory and suffix before the
work starts (so a bad ``--plot`` fails at once, not after the search).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from absl import app, flags

_HELP = ("--help", "-h", "-?", "--helpshort")
_PROBE_LOGGER = "jax._src.xla_bridge"


class _BackendProbeFilter(logging.Filter):
  """Drops JAX's "Unable to initialize backend ..." probe lines."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Unable to initialize backend")


def quiet_backend_probe() -> None:
  """Filters the backend-probe lines out of JAX's log (idempotent)."""
  logger = logging.getLogger(_PROBE_LOGGER)
  if not any(isinstance(f, _BackendProbeFilter) for f in logger.filters):
    logger.addFilter(_BackendProbeFilter())


#: Exit code of a user error (bad flag, input or file; nothing found in time).
EXIT_ERROR = 1
#: Exit code when no schedule fits under the memory limit.
EXIT_INFEASIBLE = 2


def fail(message: str, code: int = EXIT_ERROR, prefix: str = "error"
         ) -> NoReturn:
  """Prints ``prefix: message`` as one line on stderr and exits ``code``."""
  line = " ".join(str(message).split())
  print(f"{prefix}: {line}", file=sys.stderr, flush=True)
  sys.exit(code)


def user_error_code(err: BaseException) -> int | None:
  """The exit code for a user error, or None for anything else (a bug)."""
  # Imported here so that importing this module stays cheap.
  try:
    from tessel_jax.passes.errors import TesselError  # pylint: disable=import-outside-toplevel
  except ImportError:  # a source checkout without the installed alias
    from passes.errors import TesselError  # type: ignore  # pylint: disable=import-outside-toplevel
  from tessel_jax.checks import InputError  # pylint: disable=import-outside-toplevel
  from tessel_jax.search import (  # pylint: disable=import-outside-toplevel
      CompletionError, InfeasibleScheduleError, SearchTimeoutError)
  if isinstance(err, InfeasibleScheduleError):
    return EXIT_INFEASIBLE
  if isinstance(err, (app.UsageError, flags.Error, InputError, TesselError,
                      SearchTimeoutError, CompletionError, OSError,
                      UnicodeError)):
    return EXIT_ERROR
  return None


def guarded(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """``main`` with user errors turned into one stderr line and an exit code."""

  @functools.wraps(main)
  def wrapper(argv: list[str]) -> Any:
    try:
      return main(argv)
    except Exception as err:  # pylint: disable=broad-except
      code = user_error_code(err)
      if code is None:
        raise
      fail(str(err) or type(err).__name__, code,
           "infeasible" if code == EXIT_INFEASIBLE else "error")

  return wrapper


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing with a bad value reported on one stderr line.

  Every runner's time-limit flags (``--time_limit``, ``--*_time_limit``)
  must be finite seconds in ``(0, 10**6]``: NaN, 0 and negatives are
  refused here, before any work.
  """
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as err:
    fail(f"{err} (see --help)")
  from tessel_jax import checks  # pylint: disable=import-outside-toplevel
  for name, flag in _own_flags():
    if (name == "time_limit" or name.endswith("_time_limit")) and (
        flag.value is not None and not isinstance(flag.value, list)):
      try:
        checks.time_limit(flag.value, f"--{name}")
      except checks.InputError as err:
        fail(str(err))
  return rest


def _own_flags() -> list[tuple[str, Any]]:
  """``(name, flag)`` of every flag defined by an ``experiments`` module."""
  out = []
  for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith("experiments") or module == "__main__":
      out += [(f.name, f) for f in defined]
  return out


def check_output(path: str | None, flag: str,
                 suffixes: Iterable[str] = (".json",)) -> None:
  """Refuses an output path that cannot be written or has a wrong suffix.

  Args:
    path: The path (None: nothing to check).
    flag: The flag's name for the message, e.g. ``"--plot"``.
    suffixes: Allowed suffixes (lower case, with the dot).

  Raises:
    app.UsageError: naming the flag, the path and the fix.
  """
  if path is None:
    return
  suffixes = tuple(suffixes)
  if not path or os.path.isdir(path):
    raise app.UsageError(f"{flag}={path!r} is a directory or empty; give a"
                         f" file name ending in {' or '.join(suffixes)}")
  if os.path.splitext(path)[1].lower() not in suffixes:
    raise app.UsageError(f"{flag}={path!r} has an unsupported format; use a"
                         f" name ending in {' or '.join(suffixes)}")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise app.UsageError(f"{flag}={path!r}: folder {folder!r} does not"
                         " exist; create it first")
  if not os.access(folder, os.W_OK) or (
      os.path.exists(path) and not os.access(path, os.W_OK)):
    raise app.UsageError(f"{flag}={path!r} is not writable; choose a path"
                         " you can write")


def given(name: str) -> bool:
  """True when flag ``--name`` was given on the command line."""
  return flags.FLAGS[name].present > 0


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run(main)`` with ``--help`` exiting 0, a quiet probe and
  user errors on one stderr line (see the module doc)."""
  quiet_backend_probe()
  if any(arg in _HELP for arg in sys.argv[1:]):
    app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
  app.run(guarded(main), flags_parser=parse_flags)
