"""Start-up shared by the runners: ``--help`` that helps, quiet JAX logs.

Every runner ends with ``cli.run(main)`` instead of ``absl.app.run(main)``:

* ``--help`` (also ``-h``, ``-?``, ``--helpshort``) prints the runner's
  docstring and its own flags (the ``*_args`` module's flags, adopted as key
  flags by the binary) and exits 0; absl's own exits 1.
* JAX's backend probe (``Unable to initialize backend 'tpu'`` and the like,
  logged at INFO when a machine lacks that accelerator) is filtered out of
  the log; every other line passes.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from absl import app

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


def run(main: Callable[[list[str]], Any]) -> None:
  """``absl.app.run(main)`` with ``--help`` exiting 0 and a quiet probe."""
  quiet_backend_probe()
  if any(arg in _HELP for arg in sys.argv[1:]):
    app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
  app.run(main)
