"""One row per zoo model: the loop the zoo's per-model runners share.

``model_zoo_spans`` and ``model_zoo_kernels`` each build and time the zoo's
models one after another in one process: a model that fails becomes an
error row and the run goes on, the priority goes back to normal after each
model (it may have been raised to real time for the timing), every row is
logged as JSON, and the rows end as a Markdown table and a JSON record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from experiments import realtime
from experiments.runs import write_record

Row = dict[str, Any]


def error_row(name: str, err: BaseException) -> Row:
  """The row of a model whose run raised ``err``."""
  return {"model": name, "error": f"{type(err).__name__}: {err}"}


def each_model(names: Sequence[str], row: Callable[[str], Row],
               log: Callable[[str], None] = print) -> list[Row]:
  """``row(name)`` for every model (an exception: :func:`error_row`), at
  normal priority again after each; every row logged as JSON."""
  rows = []
  for name in names:
    try:
      got = row(name)
    except Exception as err:  # pylint: disable=broad-except
      got = error_row(name, err)
    finally:
      realtime.normal_priority()
    log(json.dumps(got))
    rows.append(got)
  return rows


def write_rows(args: NamedTuple, rows: Sequence[Row],
               markdown: Callable[[Sequence[Row]], str],
               load_start: Sequence[float],
               extra: Mapping[str, Any] | None = None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
  """Logs the rows' table and writes the record (``args.output``: JSON and
  a ``.md`` beside it; None: nothing written): the arguments, the rows,
  the table, ``extra`` and the load average at the start and now."""
  table = markdown(rows)
  log(table)
  record = {"args": args._asdict(), "rows": list(rows), "table": table,
            **dict(extra or {}), "load_average_start": list(load_start),
            "load_average_end": list(os.getloadavg())}
  if getattr(args, "output", None):
    write_record(args.output, record, table)
  return record
