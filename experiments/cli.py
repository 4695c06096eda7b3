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

``no_arguments`` refuses stray positional arguments (every runner's first
line of ``main``); ``at_least`` refuses integer flags under a bound;
``versions`` reads the one ``--versions`` format of the A/B runners
(``experiments.peer_compile``, ``experiments.train_cold``).

``check_output`` and ``check_created`` check an output path's folder,
writability and suffix before the work starts (so a bad ``--plot`` fails at
once, not after the search); ``check_created`` accepts a path whose folders
the runner creates itself.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, NoReturn

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


def no_arguments(argv: list[str]) -> None:
  """Refuses positional arguments: the runners take flags only.

  Raises:
    app.UsageError: naming the arguments given.
  """
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")


def at_least(low: int, *names: str) -> None:
  """Refuses any of the integer flags ``--name`` under ``low``.

  Raises:
    app.UsageError: ``--name must be >= low, got value`` (the first one).
  """
  for name in names:
    value = flags.FLAGS[name].value
    if value < low:
      raise app.UsageError(f"--{name} must be >= {low}, got {value}")


#: The ``--versions`` format, for the runners' help texts.
VERSIONS_HELP = ("label=[python@]checkout entries: a label, optionally an"
                 " interpreter and '@', then the root of a tessel_jax source"
                 " tree (empty: this checkout; python left out: this"
                 " interpreter); the first is the base")


class Version(NamedTuple):
  """One ``--versions`` entry: ``label=[python@]checkout``."""
  label: str
  checkout: str = ""  # '': this checkout
  python: str = ""  # '': this interpreter


def versions(entries: Iterable[str], flag: str = "--versions"
             ) -> tuple[Version, ...]:
  """Reads ``label=[python@]checkout`` entries (see ``VERSIONS_HELP``).

  A checkout given must hold ``tessel_jax/`` and ``passes/``.

  Raises:
    app.UsageError: naming the entry and the format.
  """
  out = []
  for entry in entries:
    label, sep, rest = entry.partition("=")
    python, at, checkout = rest.partition("@")
    if not at:
      python, checkout = "", rest
    if not sep or not label or (at and not python):
      raise app.UsageError(f"{flag} entry {entry!r}: want"
                           " label=[python@]checkout")
    if label in (v.label for v in out):
      raise app.UsageError(f"{flag}: label {label!r} given twice; give each"
                           " version its own label")
    if checkout and not all(os.path.isdir(os.path.join(checkout, d))
                            for d in ("tessel_jax", "passes")):
      raise app.UsageError(
          f"{flag} {entry}: {checkout!r} is not a tessel_jax source tree"
          " (no tessel_jax/ and passes/ in it); give the root of a checkout"
          " or of a `git archive` of one")
    out.append(Version(label, checkout, python))
  return tuple(out)


def check_output(path: str | None, flag: str,
                 suffixes: Iterable[str] = (".json",)) -> None:
  """Refuses an output file whose folder is missing, that cannot be written
  or that has a wrong suffix (for runners that do not create folders).

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
  if not path:
    raise app.UsageError(f"{flag}={path!r} is empty; give a file name"
                         f" ending in {' or '.join(suffixes)}")
  check_created(path, flag, suffixes=suffixes)
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    raise app.UsageError(f"{flag}={path!r}: folder {folder!r} does not"
                         " exist; create it first")


#: Suffixes of a markdown table output (``--markdown``).
TEXT_SUFFIXES = (".md", ".markdown", ".txt")


def check_created(path: str | None, flag: str, *, folder: bool = False,
                  suffixes: Iterable[str] | None = None) -> None:
  """Refuses an output path the runner will create (folders included).

  The path need not exist: its nearest existing ancestor must be a
  writable folder. An existing path must be a folder when ``folder`` is
  set and a writable file otherwise. A file's suffix must be one of
  ``suffixes`` (lower case, with the dot; None: any).

  Args:
    path: The path (None or ``''``: no output, nothing to check).
    flag: The flag's name for the message, e.g. ``"--output_dir"``, or
      words naming the path when no flag gives it (``"picture"``).
    folder: The runner writes files into ``path`` (a folder).
    suffixes: Allowed suffixes of a file path.

  Raises:
    app.UsageError: naming the flag, the path and the fix.
  """
  if not path:
    return
  where = f"{flag}={path!r}" if flag.startswith("-") else f"{flag} {path!r}"
  if folder and os.path.exists(path) and not os.path.isdir(path):
    raise app.UsageError(f"{where} is a file, not a folder; give a folder"
                         " (it is created if missing)")
  if not folder:
    _check_file_name(path, where, suffixes)
  target = os.path.abspath(path) if folder else os.path.dirname(
      os.path.abspath(path))
  ancestor = _nearest_existing(target)
  if not os.path.isdir(ancestor):
    raise app.UsageError(f"{where}: {ancestor!r} is a file, not a folder;"
                         " choose a path under a folder")
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise app.UsageError(f"{where} is not writable; choose a path you can"
                         " write")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise app.UsageError(f"{where} is not writable (no write permission in"
                         f" {ancestor!r}); choose a path you can write")


def _check_file_name(path: str, where: str,
                     suffixes: Iterable[str] | None) -> None:
  """Refuses a folder given as a file, or a file with a wrong suffix."""
  suffixes = None if suffixes is None else tuple(suffixes)
  wanted = " or ".join(suffixes) if suffixes is not None else ""
  if os.path.isdir(path) or path.endswith(("/", os.sep)):
    raise app.UsageError(f"{where} is a folder; give a file name"
                         + (f" ending in {wanted}" if wanted else ""))
  if suffixes is not None and (
      os.path.splitext(path)[1].lower() not in suffixes):
    raise app.UsageError(f"{where} has an unsupported format; use a name"
                         f" ending in {wanted}")


def _nearest_existing(path: str) -> str:
  """``path`` or its nearest ancestor that exists (``path`` absolute)."""
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


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
