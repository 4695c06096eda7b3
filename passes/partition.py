"""Partition pass: cut a traced step function into forward blocks.

``passes.tracing.trace`` turns ``fn(params, microbatch)`` into a jaxpr and
checks where the ``tj.boundary`` markers sit; ``partition`` cuts its
top-level equations at the boundaries into forward blocks numbered in
program order and finds, for each block, the values it reads (parameter
leaves, micro-batch leaves, outputs of earlier blocks) and the values it
exports.

The function's outputs are computed by the last block. When the last block
reads a value from a block the placement does not order before it (the two
towers of an X-shape meet only in the loss), the equations downstream of that
value form the *epilogue*: a function of block outputs ("terminals") applied
after the pipeline. In training the epilogue must be affine (a sum or
weighted sum of per-block losses), so its gradient is a constant seed.

With ``has_aux=True`` (as in ``jax.value_and_grad``) ``fn`` returns
``(loss, aux)``; the flat outputs are the loss (or, in inference, the
outputs) followed by the aux leaves. An aux leaf computed inside a block is a
terminal of *that* block (it is not passed down the pipeline to the last
block), and the epilogue evaluates the aux part per micro-batch; only the
loss part has to be affine, since aux outputs are not differentiated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from tessel_jax import compat

from .errors import fail
from .tracing import Traced


@dataclasses.dataclass(frozen=True)
class Source:
  """Where a value a block reads comes from.

  Attributes:
    kind: ``"param"`` (a parameter leaf), ``"batch"`` (a micro-batch leaf) or
      ``"act"`` (an output of an earlier block).
    index: Leaf index for ``param``/``batch``; producing block for ``act``.
    output: Position in the producing block's outputs (``act`` only).
  """

  kind: str
  index: int
  output: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardBlock:
  """One forward block: a slice of the traced jaxpr.

  Attributes:
    index: Block number (program order).
    eqns: Its equations.
    invars: Variables it reads, aligned with ``inputs``.
    inputs: Where each input comes from.
    const_vars: Closed-over constants it reads.
    const_vals: Their values.
    outvars: Variables (or literals) it exports, aligned with ``out_avals``.
    in_avals: Input shapes/dtypes.
    out_avals: Output shapes/dtypes.
  """

  index: int
  eqns: tuple[Any, ...]
  invars: tuple[Any, ...]
  inputs: tuple[Source, ...]
  const_vars: tuple[Any, ...]
  const_vals: tuple[Any, ...]
  outvars: tuple[Any, ...]
  in_avals: tuple[jax.ShapeDtypeStruct, ...]
  out_avals: tuple[jax.ShapeDtypeStruct, ...]

  def __call__(self, *inputs: Any) -> list[Any]:
    """Runs the block on values aligned with ``inputs``."""
    return compat.eval_eqns(self.eqns, self.invars + self.const_vars,
                            self.outvars, list(inputs) + list(self.const_vals))

  @property
  def param_inputs(self) -> tuple[int, ...]:
    """Positions of parameter inputs."""
    return tuple(i for i, s in enumerate(self.inputs) if s.kind == "param")


@dataclasses.dataclass(frozen=True, eq=False)
class Epilogue:
  """The function's outputs as a function of block outputs (terminals).

  Attributes:
    terminals: Block outputs the epilogue reads (``act`` sources).
    eqns: Its equations (empty: outputs are terminals or literals).
    invars: Variables aligned with ``terminals``.
    const_vars: Closed-over constants.
    const_vals: Their values.
    outvars: The function's flat outputs.
  """

  terminals: tuple[Source, ...]
  eqns: tuple[Any, ...]
  invars: tuple[Any, ...]
  const_vars: tuple[Any, ...]
  const_vals: tuple[Any, ...]
  outvars: tuple[Any, ...]

  @property
  def is_identity(self) -> bool:
    """True when the outputs are exactly the terminals, in order."""
    return (not self.eqns and len(self.outvars) == len(self.invars) and
            all(o is i for o, i in zip(self.outvars, self.invars)))

  def __call__(self, *terminal_values: Any) -> list[Any]:
    return compat.eval_eqns(self.eqns, self.invars + self.const_vars,
                            self.outvars,
                            list(terminal_values) + list(self.const_vals))

  def select(self, outputs: Sequence[int]) -> "Epilogue":
    """The epilogue of outputs ``outputs`` only (other equations pruned).

    It still takes every terminal (positions unchanged); terminals outside
    :meth:`reads` are not used.
    """
    outvars = tuple(self.outvars[o] for o in outputs)
    return dataclasses.replace(self, eqns=tuple(_needed(self.eqns, outvars)),
                               outvars=outvars)

  def reads(self, outputs: Sequence[int]) -> tuple[int, ...]:
    """Positions of the terminals outputs ``outputs`` depend on."""
    outvars = [self.outvars[o] for o in outputs]
    live = {v for v in outvars if not compat.is_literal(v)}
    for eqn in _needed(self.eqns, outvars):
      live.update(v for v in eqn.invars if not compat.is_literal(v))
    return tuple(j for j, v in enumerate(self.invars) if v in live)


def _needed(eqns: Sequence[Any], outvars: Sequence[Any]) -> list[Any]:
  """Equations ``outvars`` depend on, in program order."""
  live = {v for v in outvars if not compat.is_literal(v)}
  keep = []
  for eqn in reversed(eqns):
    if any(v in live for v in eqn.outvars if not compat.is_dropvar(v)):
      keep.append(eqn)
      live.update(v for v in eqn.invars if not compat.is_literal(v))
  return keep[::-1]


@dataclasses.dataclass(frozen=True, eq=False)
class Partition:
  """Forward blocks of a traced function plus its epilogue.

  Attributes:
    traced: The trace it came from.
    blocks: Forward blocks in program order.
    epilogue: Outputs from terminals.
    edges: Data edges ``(producer, consumer)`` between blocks.
  """

  traced: Traced
  blocks: tuple[ForwardBlock, ...]
  epilogue: Epilogue
  edges: tuple[tuple[int, int], ...]

  @property
  def fn_name(self) -> str:
    return self.traced.fn_name

  @property
  def out_avals(self) -> tuple[jax.ShapeDtypeStruct, ...]:
    return tuple(_aval(v) for v in self.epilogue.outvars)

  @property
  def primary_outputs(self) -> tuple[int, ...]:
    """Flat output positions of the loss (or outputs), before any aux."""
    return tuple(range(len(self.epilogue.outvars) - self.traced.num_aux))

  @property
  def aux_outputs(self) -> tuple[int, ...]:
    """Flat output positions of the aux leaves (empty without has_aux)."""
    n = len(self.epilogue.outvars)
    return tuple(range(n - self.traced.num_aux, n))

  @property
  def aux_terminals(self) -> tuple[int, ...]:
    """Terminals the aux outputs read (accumulated per micro-batch)."""
    return self.epilogue.reads(self.aux_outputs) if self.aux_outputs else ()


def _aval(atom: Any) -> jax.ShapeDtypeStruct:
  aval = atom.aval
  return jax.ShapeDtypeStruct(tuple(aval.shape), aval.dtype)


def partition(traced: Traced,
              reach: Callable[[int, int], bool] | None = None) -> Partition:
  """Cuts the traced function into forward blocks.

  The steps: the top-level equations are cut at the boundaries
  (``_segments``), the last segment's equations downstream of a block the
  placement does not order before it become the epilogue
  (``_split_epilogue``), each segment's outside reads (``_segment_reads``)
  and the epilogue's terminals (``_terminal_vars``) decide what every block
  exports (``_exports``), and the blocks (``_block``) and the epilogue
  (``_identity_epilogue`` / ``_combining_epilogue``) are built.

  Args:
    traced: From :func:`trace`.
    reach: ``reach(i, j)``: the placement orders forward block ``i`` before
      block ``j`` (a path of edges). None: every earlier block reaches every
      later block.

  Raises:
    TesselError: if a block reads a value from a block the placement does not
      order before it, or the epilogue reads parameters or the batch.
  """
  reach = reach or (lambda i, j: i < j)
  jaxpr = traced.closed_jaxpr.jaxpr
  consts = dict(zip(jaxpr.constvars, traced.closed_jaxpr.consts))
  where = _input_sources(jaxpr, len(traced.param_avals))
  segments, defined_in = _segments(jaxpr)
  last = len(segments) - 1
  segments[last], epi_eqns = _split_epilogue(segments[last], defined_in,
                                             last, reach)
  outvars = list(jaxpr.outvars)
  # Aux leaves computed in a block are terminals of that block (never sent
  # down the pipeline), so the epilogue is the identity only when they all
  # come from the last block.
  trivial = not epi_eqns and _outputs_reach_last(
      outvars, len(outvars) - traced.num_aux, defined_in, last, reach)
  reads = _segment_reads(segments)
  if trivial:
    for v in outvars:
      if (not compat.is_literal(v) and v not in reads[last] and
          defined_in.get(v, -1) != last):
        reads[last].append(v)
    terminal_vars, term_block = [], {}
  else:
    terminal_vars, term_block = _terminal_vars(
        traced.fn_name, epi_eqns, outvars, consts, where, defined_in,
        reads[last], last)
  exports = _exports(reads, defined_in)
  if trivial:
    exports[last] = list(outvars)
  else:
    for v in terminal_vars:
      if v not in exports[term_block[v]]:
        exports[term_block[v]].append(v)
  edges: set[tuple[int, int]] = set()
  blocks = tuple(
      _block(traced.fn_name, k, seg, reads[k], exports, consts, defined_in,
             where, reach, edges) for k, seg in enumerate(segments))
  if trivial:
    epilogue = _identity_epilogue(outvars, last)
  else:
    epilogue = _combining_epilogue(epi_eqns, outvars, consts, terminal_vars,
                                   term_block, exports, blocks[last], edges)
  return Partition(traced=traced, blocks=blocks, epilogue=epilogue,
                   edges=tuple(sorted(edges)))


def _input_sources(jaxpr: Any, num_params: int) -> dict[Any, Source | str]:
  """Each jaxpr input -> its parameter or batch leaf; constvars -> "const"."""
  where: dict[Any, Source | str] = {}
  for i, v in enumerate(jaxpr.invars):
    where[v] = (Source("param", i) if i < num_params
                else Source("batch", i - num_params))
  for v in jaxpr.constvars:
    where[v] = "const"
  return where


def _segments(jaxpr: Any) -> tuple[list[list[Any]], dict[Any, int]]:
  """The top-level equations cut after each boundary, and the segment
  defining every variable."""
  segments: list[list[Any]] = [[]]
  for eqn in jaxpr.eqns:
    segments[-1].append(eqn)
    if compat.is_boundary(eqn):
      segments.append([])
  defined_in: dict[Any, int] = {}
  for k, seg in enumerate(segments):
    for eqn in seg:
      for v in eqn.outvars:
        if not compat.is_dropvar(v):
          defined_in[v] = k
  return segments, defined_in


def _split_epilogue(seg: Sequence[Any], defined_in: dict[Any, int],
                    last: int, reach: Callable[[int, int], bool]
                    ) -> tuple[list[Any], list[Any]]:
  """``(last block's equations, epilogue equations)``: the epilogue is what
  the last segment computes downstream of a value whose producer the
  placement does not order before the last block."""
  epi_vars: set[Any] = set()
  epi_eqns: list[Any] = []
  body_last: list[Any] = []
  for eqn in seg:
    is_epi = False
    for v in eqn.invars:
      if compat.is_literal(v):
        continue
      if v in epi_vars:
        is_epi = True
      elif v in defined_in and defined_in[v] != last and not reach(
          defined_in[v], last):
        is_epi = True
    if is_epi:
      epi_eqns.append(eqn)
      epi_vars.update(v for v in eqn.outvars if not compat.is_dropvar(v))
    else:
      body_last.append(eqn)
  return body_last, epi_eqns


def _outputs_reach_last(outvars: Sequence[Any], num_primary: int,
                        defined_in: dict[Any, int], last: int,
                        reach: Callable[[int, int], bool]) -> bool:
  """Whether the last block can compute every output: each is a literal, an
  input, from the last block, or (primary outputs) from a block before it."""
  return all(
      compat.is_literal(v) or v not in defined_in or defined_in[v] == last or
      (k < num_primary and reach(defined_in[v], last))
      for k, v in enumerate(outvars))


def _segment_reads(segments: Sequence[Sequence[Any]]) -> list[list[Any]]:
  """Per segment, the variables it reads from outside itself, in order."""
  reads: list[list[Any]] = []
  for seg in segments:
    seen, order = set(), []
    local = {v for e in seg for v in e.outvars}
    for eqn in seg:
      for v in eqn.invars:
        if compat.is_literal(v) or v in local or v in seen:
          continue
        seen.add(v)
        order.append(v)
    reads.append(order)
  return reads


def _terminal_vars(name: str, epi_eqns: Sequence[Any],
                   outvars: Sequence[Any], consts: dict[Any, Any],
                   where: dict[Any, Source | str],
                   defined_in: dict[Any, int], last_reads: list[Any],
                   last: int) -> tuple[list[Any], dict[Any, int]]:
  """``(terminals, variable -> producing block)``: the block outputs the
  epilogue reads. An output that is a parameter or batch leaf itself is
  passed through the last block (appended to ``last_reads``)."""
  local = {v for e in epi_eqns for v in e.outvars}
  epi_reads = [v for e in epi_eqns for v in e.invars]
  terminal_vars, seen = [], set()
  term_block = dict(defined_in)
  for pos, atom in enumerate(epi_reads + list(outvars)):
    if compat.is_literal(atom) or atom in local or atom in seen:
      continue
    seen.add(atom)
    if atom in consts:
      continue
    src = where.get(atom)
    if isinstance(src, Source) and pos >= len(epi_reads):
      last_reads.append(atom)
      term_block[atom] = last
    elif isinstance(src, Source):
      raise fail(
          name,
          f"the outputs combine values of blocks the placement runs"
          f" independently, and that combination also reads a {src.kind}"
          f" leaf directly; compute it inside a block (e.g. add the"
          f" regulariser to one block's loss) so the final combination"
          f" only reads block outputs")
    terminal_vars.append(atom)
  return terminal_vars, term_block


def _exports(reads: Sequence[Sequence[Any]],
             defined_in: dict[Any, int]) -> list[list[Any]]:
  """Per block, the values later blocks read from it (terminals are added
  by the caller)."""
  exports: list[list[Any]] = [[] for _ in reads]
  for k, vars_read in enumerate(reads):
    for v in vars_read:
      if v in defined_in and defined_in[v] != k:
        src = defined_in[v]
        if v not in exports[src]:
          exports[src].append(v)
  return exports


def _block(name: str, k: int, seg: Sequence[Any], reads: Sequence[Any],
           exports: Sequence[Sequence[Any]], consts: dict[Any, Any],
           defined_in: dict[Any, int], where: dict[Any, Source | str],
           reach: Callable[[int, int], bool],
           edges: set[tuple[int, int]]) -> ForwardBlock:
  """Forward block ``k``; adds the data edges into it to ``edges``."""
  invars, inputs, cvars, cvals = [], [], [], []
  for v in reads:
    if v in consts:
      cvars.append(v)
      cvals.append(consts[v])
    elif v in defined_in:
      src = defined_in[v]
      if not reach(src, k):
        raise fail(
            name,
            f"block {k} reads a value computed in block {src}, but the"
            f" placement does not run block {src} before block {k} (no"
            f" path of edges F{src} -> F{k}); pass the value through the"
            f" blocks in between, or pick a placement whose edges follow"
            f" the data flow")
      edges.add((src, k))
      invars.append(v)
      inputs.append(Source("act", src, exports[src].index(v)))
    else:
      invars.append(v)
      inputs.append(where[v])
  return ForwardBlock(
      index=k, eqns=tuple(seg), invars=tuple(invars), inputs=tuple(inputs),
      const_vars=tuple(cvars), const_vals=tuple(cvals),
      outvars=tuple(exports[k]),
      in_avals=tuple(_aval(v) for v in invars),
      out_avals=tuple(_aval(v) for v in exports[k]))


def _identity_epilogue(outvars: Sequence[Any], last: int) -> Epilogue:
  """The outputs are the last block's outputs, read positionally (literal
  outputs are computed by the last block)."""
  terminals = tuple(Source("act", last, i) for i in range(len(outvars)))
  fresh = tuple(_fresh_like(v) for v in outvars)
  return Epilogue(terminals=terminals, eqns=(), invars=fresh, const_vars=(),
                  const_vals=(), outvars=fresh)


def _combining_epilogue(epi_eqns: Sequence[Any], outvars: Sequence[Any],
                        consts: dict[Any, Any], terminal_vars: Sequence[Any],
                        term_block: dict[Any, int],
                        exports: Sequence[Sequence[Any]],
                        last_block: ForwardBlock,
                        edges: set[tuple[int, int]]) -> Epilogue:
  """The epilogue combining terminals of several blocks; drops the edges
  into the last block that only carried terminals."""
  epi_consts = [v for e in epi_eqns for v in e.invars
                if not compat.is_literal(v) and v in consts]
  epi_consts = list(dict.fromkeys(epi_consts))
  terminals = tuple(
      Source("act", term_block[v], exports[term_block[v]].index(v))
      for v in terminal_vars)
  last = last_block.index
  last_reads = {s.index for s in last_block.inputs if s.kind == "act"}
  for t in terminals:
    if t.index not in last_reads:  # keep real data edges into the last block
      edges.discard((t.index, last))
  return Epilogue(terminals=terminals, eqns=tuple(epi_eqns),
                  invars=tuple(terminal_vars),
                  const_vars=tuple(epi_consts),
                  const_vals=tuple(consts[v] for v in epi_consts),
                  outvars=tuple(outvars))


def _fresh_like(atom: Any) -> Any:
  """A new jaxpr variable with the aval of ``atom``."""
  return compat.new_var(atom.aval)


def leaves_used(block: ForwardBlock, kind: str) -> tuple[int, ...]:
  """Leaf indices of ``kind`` (``param``/``batch``) a block reads."""
  return tuple(s.index for s in block.inputs if s.kind == kind)
