"""Partition pass: trace a step function and cut it into forward blocks.

``trace`` turns ``fn(params, microbatch)`` into a jaxpr and checks where the
``tj.boundary`` markers sit; ``partition`` cuts the top-level equations at the
boundaries into forward blocks numbered in program order and finds, for each
block, the values it reads (parameter leaves, micro-batch leaves, outputs of
earlier blocks) and the values it exports.

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
import numpy as np

from tessel_jax import compat

from . import scan_split
from .errors import TesselError, fail

_JIT_PRIMITIVES = ("pjit", "jit", "closed_call", "core_call")
_PRIMITIVE_WORDS = {
    "cond": "a lax.cond / lax.switch branch",
    "while": "a lax.while_loop / fori_loop body",
    "scan": "a lax.scan (or fori_loop) body",
    "checkpoint": "a jax.checkpoint (remat) function",
    "remat": "a jax.checkpoint (remat) function",
    "custom_jvp_call": "a jax.custom_jvp function",
    "custom_vjp_call": "a jax.custom_vjp function",
    "custom_vjp_call_jaxpr": "a jax.custom_vjp function",
    "shard_map": "a shard_map body",
}


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
class Traced:
  """A step function traced on one micro-batch.

  Attributes:
    fn_name: Name used in error messages.
    closed_jaxpr: The jaxpr of ``fn(params, microbatch)`` on flat leaves.
    param_tree: Tree structure of ``params``.
    batch_tree: Tree structure of the micro-batch.
    out_tree: Tree structure of the outputs.
    param_avals: Flat parameter shapes.
    batch_avals: Flat micro-batch shapes.
    num_blocks: Top-level boundaries + 1.
    aux_tree: With ``has_aux``: tree structure of ``aux`` (its leaves are
      the last flat outputs); None without.
    primary_tree: With ``has_aux``: tree structure of the loss (training)
      or outputs (inference); None without.
    leaf_split: A ``scan_split.LeafSplit`` when stacked parameter leaves are
      stored as slices (``param_tree``/``param_avals`` then describe the
      stored leaves, a flat tuple); None otherwise.
  """

  fn_name: str
  closed_jaxpr: Any
  param_tree: Any
  batch_tree: Any
  out_tree: Any
  param_avals: tuple[jax.ShapeDtypeStruct, ...]
  batch_avals: tuple[jax.ShapeDtypeStruct, ...]
  num_blocks: int
  aux_tree: Any = None
  primary_tree: Any = None
  leaf_split: Any = None

  @property
  def has_aux(self) -> bool:
    return self.aux_tree is not None

  @property
  def num_aux(self) -> int:
    """Flat aux outputs (the last ones)."""
    return self.aux_tree.num_leaves if self.aux_tree is not None else 0


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


def _nested_boundaries(jaxpr: Any) -> list[tuple[str, ...]]:
  """Enclosing-primitive paths of every boundary below the top level."""
  return [path for eqn, path in compat.iter_eqns_deep(jaxpr)
          if compat.is_boundary(eqn) and path]


def _describe(primitive: str) -> str:
  return _PRIMITIVE_WORDS.get(primitive, f"a {primitive!r} sub-computation")


def trace(fn: Callable[..., Any], fn_name: str, params: Any,
          microbatch: Any, has_aux: bool = False) -> Traced:
  """Traces ``fn(params, microbatch)`` and checks the boundary placement.

  Args:
    fn: The step function.
    fn_name: Its name for messages.
    params: Parameter pytree (arrays or ShapeDtypeStructs).
    microbatch: One micro-batch (arrays or ShapeDtypeStructs).
    has_aux: ``fn`` returns ``(loss, aux)`` (``jax.value_and_grad``'s
      convention).

  Raises:
    TesselError: if a boundary sits inside a cond/while body or another
      higher-order primitive (a boundary directly in the body of a top-level
      scan cuts the scan after every iteration, ``scan_split.split_marked``), an output leaf is not an array, or with
      ``has_aux`` the result is not a pair.
  """
  p_leaves, p_tree = jax.tree_util.tree_flatten(params)
  b_leaves, b_tree = jax.tree_util.tree_flatten(microbatch)
  p_avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in p_leaves)
  b_avals = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in b_leaves)
  n_p = len(p_leaves)
  trees: dict[str, Any] = {}

  def flat_fn(*leaves: Any) -> Any:
    p = jax.tree_util.tree_unflatten(p_tree, leaves[:n_p])
    b = jax.tree_util.tree_unflatten(b_tree, leaves[n_p:])
    out = fn(p, b)
    if has_aux:
      _check_pair(fn_name, out)
      trees["primary"] = jax.tree_util.tree_structure(out[0])
      trees["aux"] = jax.tree_util.tree_structure(out[1])
      _check_arrays(fn_name, out[0], "the first element of fn's result")
      _check_arrays(fn_name, out[1], "aux")
    else:
      _check_arrays(fn_name, out, "fn's result")
    return out

  closed, out_tree = _make_jaxpr(flat_fn, *p_avals, *b_avals)
  nested = _nested_boundaries(closed.jaxpr)
  if nested:
    blocking = [p for p in nested
                if any(name not in _JIT_PRIMITIVES for name in p)]
    if not blocking:
      # Boundaries only inside nested jax.jit calls: inline them.
      closed, out_tree = _make_jaxpr(flat_fn, *p_avals, *b_avals,
                                     inline_jit=True)
      nested = _nested_boundaries(closed.jaxpr)
      blocking = nested
    if blocking and all(p == ("scan",) for p in blocking):
      # Boundaries in the body of a top-level scan: cut after every layer.
      closed = scan_split.split_marked(closed)
      blocking = [p for p in _nested_boundaries(closed.jaxpr)
                  if any(name not in _JIT_PRIMITIVES for name in p)]
    if blocking:
      outer = next(name for name in blocking[0]
                   if name not in _JIT_PRIMITIVES)
      raise fail(
          fn_name,
          f"tj.boundary is called inside {_describe(outer)}; blocks can only"
          " be cut at the top level of the step function or directly in the"
          " body of a top-level lax.scan (which cuts the scanned stack after"
          " every iteration). Move the boundary out of the control-flow"
          " body, or leave the stack unmarked and pass cut='auto' to cut"
          " the scan at iteration boundaries by cost.")
  num_blocks = 1 + sum(1 for e in closed.jaxpr.eqns if compat.is_boundary(e))
  return Traced(fn_name=fn_name, closed_jaxpr=closed, param_tree=p_tree,
                batch_tree=b_tree, out_tree=out_tree, param_avals=p_avals,
                batch_avals=b_avals, num_blocks=num_blocks,
                aux_tree=trees.get("aux"), primary_tree=trees.get("primary"))


def _make_jaxpr(flat_fn: Callable[..., Any], *avals: Any,
                inline_jit: bool = False) -> tuple[Any, Any]:
  """``compat.make_jaxpr``; an error raised while tracing is raised again
  without the note JAX adds about its filtered frames."""
  try:
    return compat.make_jaxpr(flat_fn, *avals, inline_jit=inline_jit)
  except TesselError as err:
    raise TesselError(*err.args) from None


def _check_pair(fn_name: str, out: Any) -> None:
  """``has_aux``: the result must be a 2-tuple ``(loss, aux)``."""
  if isinstance(out, tuple) and len(out) == 2:
    return
  if isinstance(out, (tuple, list)):
    what = f"a {type(out).__name__} of length {len(out)}"
  elif hasattr(out, "shape") and hasattr(out, "dtype"):
    what = f"one array of shape {tuple(out.shape)}"
  else:
    what = f"a {type(out).__name__}"
  raise fail(fn_name, f"has_aux=True needs fn to return a pair (loss, aux),"
             f" as jax.value_and_grad(has_aux=True) does; it returned {what}."
             f" Return a tuple (loss, aux), or drop has_aux=True")


def _is_array(x: Any) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic, bool, int, float,
                        complex))


def _check_arrays(fn_name: str, tree: Any, what: str) -> None:
  """Every leaf of ``tree`` is an array (or a Python number)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not _is_array(leaf):
      where = jax.tree_util.keystr(path) or "(the whole value)"
      raise fail(fn_name, f"{what} must be a pytree of arrays, but its leaf"
                 f" {where} is a {type(leaf).__name__} ({leaf!r:.60}); return"
                 f" arrays only (keep Python values such as strings outside"
                 f" the traced function)")


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


def block_summary(part: Partition) -> list[str]:
  """One line per block: inputs and outputs (for errors and debugging)."""
  lines = []
  for b in part.blocks:
    ins = ", ".join(f"{s.kind}{s.index}" + (f".{s.output}" if s.kind == "act"
                                            else "") for s in b.inputs)
    outs = ", ".join(f"{tuple(a.shape)}:{a.dtype}" for a in b.out_avals)
    lines.append(f"F{b.index}: reads [{ins}] -> [{outs}]")
  return lines


def leaves_used(block: ForwardBlock, kind: str) -> tuple[int, ...]:
  """Leaf indices of ``kind`` (``param``/``batch``) a block reads."""
  return tuple(s.index for s in block.inputs if s.kind == kind)


def check_divisible(fn_name: str, batch_avals: Sequence[Any],
                    num_microbatches: int) -> int:
  """Returns the micro-batch size; raises unless the batch splits evenly.

  Args:
    fn_name: For messages.
    batch_avals: Flat leaves of the whole batch.
    num_microbatches: N.
  """
  if not batch_avals:
    raise fail(fn_name, "the batch has no array leaves; pass the batch as the"
               " second argument, split along axis 0 into micro-batches")
  sizes = set()
  for a in batch_avals:
    if not a.shape:
      raise fail(fn_name, f"a batch leaf is a scalar (shape ()); every batch"
                 f" leaf needs a leading batch axis to split into"
                 f" {num_microbatches} micro-batches")
    sizes.add(a.shape[0])
  if len(sizes) != 1:
    raise fail(fn_name, f"batch leaves have different leading sizes"
               f" {sorted(sizes)}; every leaf must have the same batch axis 0")
  size = sizes.pop()
  if num_microbatches < 1 or size % num_microbatches:
    raise fail(fn_name, f"the batch has {size} examples along axis 0, which"
               f" does not divide into num_microbatches={num_microbatches};"
               f" pick a divisor of {size} or pad the batch")
  return size // num_microbatches
