"""Per-device action orders of the V-shape baselines DualPipeV and ZB-V.

Both run on a V placement (``placements.zbv``): ``2D`` chained stages,
stage ``s`` on device ``s`` for ``s < D`` and on device ``2D-1-s`` after,
so device ``r`` holds the *first half* stage ``r`` and the *second half*
stage ``2D-1-r``; the backward is split into ``B`` (input gradient) and
``W`` (weight gradient). An order is a list of ``(kind, half, micro-batch)``
with kind ``"F"``, ``"B"`` or ``"W"`` and half 0 (stage ``r``) or 1 (stage
``2D-1-r``). ``tessel_jax.search.baselines`` turns them into timed
schedules. Pure Python; no jax, no ortools.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

Op = tuple[str, int, int]  # (kind, half, micro-batch)


class _Counter:
  """Hands out micro-batch indices per (kind, half) in order, and queues
  deferred weight gradients (first in, first out)."""

  def __init__(self) -> None:
    self.next: dict[tuple[str, int], int] = collections.defaultdict(int)
    self.deferred: collections.deque[tuple[int, int]] = collections.deque()
    self.order: list[Op] = []

  def run(self, kind: str, half: int) -> None:
    m = self.next[(kind, half)]
    self.next[(kind, half)] = m + 1
    self.order.append((kind, half, m))

  def backward(self, half: int, zero_bubble: bool) -> None:
    """``B``; its ``W`` right after, or deferred with ``zero_bubble``."""
    m = self.next[("B", half)]
    self.run("B", half)
    if zero_bubble:
      self.deferred.append((half, m))
    else:
      self.order.append(("W", half, m))

  def weight(self) -> None:
    half, m = self.deferred.popleft()
    self.order.append(("W", half, m))


def dualpipev_orders(num_devices: int, num_microbatches: int
                     ) -> list[list[Op]]:
  """DualPipeV (DeepSeek's DualPipe repository, ``dualpipev.py``).

  Rank ``r`` of ``R`` runs eight phases: ``2(R-r-1)`` forwards of its first
  half; ``r+1`` pairs F(first) F(second); ``R-r-1`` triples B(second)
  W F(second) (zero bubble: the W waits in a queue and runs at once); the
  main phase of ``N-2R+r+1`` quadruples F(first) B(second) F(second)
  B(first) with fused B+W; ``R-r-1`` triples B(second) F(second)
  B(first); ``r+1`` pairs B(second) B(first), deferring W from the middle
  of the phase on; ``R-r-1`` pairs W B(first, deferred W); ``r+1`` Ws.
  DualPipe overlaps the F and B of a pair with each other's communication;
  here they run one after the other.

  Raises:
    ValueError: unless ``N >= 2R``.
  """
  r_count, n = num_devices, num_microbatches
  if n < 2 * r_count:
    raise ValueError(f"DualPipeV needs at least 2 x {r_count} devices ="
                     f" {2 * r_count} micro-batches, got {n}")
  return [_dualpipev_rank(r, r_count, n) for r in range(r_count)]


def _dualpipev_rank(r: int, ranks: int, n: int) -> list[Op]:
  c = _Counter()
  for _ in range(2 * (ranks - r - 1)):
    c.run("F", 0)
  for _ in range(r + 1):
    c.run("F", 0)
    c.run("F", 1)
  for _ in range(ranks - r - 1):
    c.backward(1, zero_bubble=True)
    c.weight()
    c.run("F", 1)
  for _ in range(n - 2 * ranks + r + 1):
    c.run("F", 0)
    c.backward(1, zero_bubble=False)
    c.run("F", 1)
    c.backward(0, zero_bubble=False)
  for _ in range(ranks - r - 1):
    c.backward(1, zero_bubble=False)
    c.run("F", 1)
    c.backward(0, zero_bubble=False)
  zb = False
  for i in range(r + 1):
    if i == (r + 1) // 2 and r % 2 == 1:
      zb = True
    c.backward(1, zero_bubble=zb)
    if i == (r + 1) // 2 and r % 2 == 0:
      zb = True
    c.backward(0, zero_bubble=zb)
  for _ in range(ranks - r - 1):
    c.weight()
    c.backward(0, zero_bubble=True)
  while c.deferred:
    c.weight()
  return c.order


# --- ZB-V ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Costs:
  """Spans and memory of F, B, W (one chunk) and the memory cap."""

  span: tuple[int, int, int]
  memory: tuple[int, int, int]
  max_memory: int
  comm: int = 0


class _ZbvGreedy:
  """The ZB-V greedy of the zero-bubble repository (``zbv.py``,
  ``PipelineGraph.try_v_schedule``), re-expressed.

  Internally backward "chunk" 0 is the second half's backward (it flows
  from device 0 to D-1, like the first half's forward) and chunk 1 the first
  half's; :meth:`orders` maps them back to halves.
  """

  def __init__(self, d: int, n: int, costs: Costs, fill_f: bool,
               fill_b: bool, approved: Sequence[int] | None):
    self.d, self.n, self.c = d, n, costs
    self.fill_f, self.fill_b = fill_f, fill_b
    self.approved = list(approved) if approved is not None else [-1] * d
    self.count = [[0] * 6 for _ in range(d)]
    self.end: dict[tuple[int, int, int, int], int] = {}
    self.now = [0] * d
    self.mem = [0] * d
    self.bubble = [0] * d
    self.pending: list[collections.deque[int]] = [collections.deque()
                                                  for _ in range(d)]
    self.seq: list[list[tuple[int, int, int]]] = [[] for _ in range(d)]

  def _end(self, cat: int, chunk: int, dev: int, m: int) -> int:
    return self.end.get((cat, chunk, dev, m), -1)

  def max_bubble(self, dev: int = -1) -> int:
    top = max(self.bubble)
    if dev >= 0:
      top = max(top, max(self.approved) - self.approved[dev])
    return top

  def put(self, cat: int, chunk: int, dev: int) -> None:
    m = self.count[dev][cat * 2 + chunk]
    if m >= self.n or self.mem[dev] + self.c.memory[cat] > self.c.max_memory:
      raise _Stuck()
    ideal = t = self.now[dev] + self.c.span[cat]
    if cat < 2:
      src = dev + 1 if chunk == 1 else dev - 1
      if 0 <= src < self.d:
        before = self._end(cat, chunk, src, m)
        if before < 0:
          raise _Stuck()
        t = max(t, before + self.c.comm + self.c.span[cat])
    if self.count[dev][0] > 0:
      self.bubble[dev] += t - ideal
    self.end[(cat, chunk, dev, m)] = t
    self.now[dev] = t
    self.mem[dev] += self.c.memory[cat]
    self.seq[dev].append((cat, chunk, m))
    if cat == 1:
      self.pending[dev].append(chunk)
    self.count[dev][cat * 2 + chunk] += 1

  def put_w(self, dev: int) -> None:
    if not self.pending[dev]:
      raise _Stuck()
    self.put(2, self.pending[dev].popleft(), dev)

  def _fill_w(self, dev: int, src: tuple[int, int, int, int],
              fill: bool) -> None:
    """Runs deferred Ws while ``dev`` would wait for ``src`` anyway."""
    ready = self._end(*src) + self.c.comm
    while self.pending[dev] and ready >= self.now[dev] + self.c.span[2]:
      self.put_w(dev)
    if (self.pending[dev] and ready - self.now[dev] >
        self.max_bubble(dev) - self.bubble[dev] and fill):
      self.put_w(dev)

  def run(self) -> None:
    self._warmup()
    for _ in range(2 * self.n):
      self._backward_round()
      self._forward_round()
    for dev in range(self.d):
      while self.pending[dev]:
        self.put_w(dev)

  def _warmup(self) -> None:
    d, fm = self.d, self.c.memory[0]
    for i in range(d):
      self.put(0, 0, i)
    for i in range(d - 1, -1, -1):
      if i < d - 1:
        limit = self._end(0, 1, i + 1, 0) + self.c.comm
        while (self.mem[i] + fm * (2 + 2 * i) <= self.c.max_memory and
               self.now[i] + self.c.span[0] <= limit and
               self.count[i][0] < self.n):
          for j in range(i + 1):
            self.put(0, 0, j)
      self.put(0, 1, i)
    chunk = 0
    for i in range(1, d):
      while (self.count[i][0] + self.count[i][1] <
             self.count[i - 1][0] + self.count[i - 1][1] or
             self.count[i][1] <= self.count[i - 1][1] < self.n):
        for j in range(d - 1, i - 1, -1):
          if self.count[j][chunk] < self.n:
            self.put(0, chunk, j)
        chunk = 1 - chunk

  def _backward_round(self) -> None:
    d, cnt = self.d, self.count
    for i in range(d):
      while self.mem[i] + self.c.memory[1] > self.c.max_memory:
        self.put_w(i)
    first, second = [], []
    for i in range(d):
      if cnt[i][3] >= cnt[i][2]:
        first.append(i)
      elif i == d - 1 or cnt[i][2] >= self.n or self._end(
          1, 1, i + 1, cnt[i][3]) >= 0:
        second.append(i)
      else:
        first.append(i)
    for i, chunk in [(i, 1) for i in reversed(second)] + [(i, 0)
                                                          for i in first]:
      src = None
      if chunk == 1 and i < d - 1:
        src = (1, 1, i + 1, cnt[i][3])
      if chunk == 0 and i > 0:
        src = (1, 0, i - 1, cnt[i][2])
      if src is not None:
        self._fill_w(i, src, fill=chunk == 1 or self.fill_b)
      self.put(1, chunk, i)

  def _forward_round(self) -> None:
    d, cnt = self.d, self.count
    for i in range(d):
      if cnt[i][1] >= self.n:
        continue
      item = None
      if cnt[i][1] >= cnt[i][0]:
        item = 0
      elif i == d - 1 or self._end(0, 1, i + 1, cnt[i][1]) >= 0:
        item = 1
      elif cnt[i][0] < self.n and (i == 0 or
                                   self._end(0, 0, i - 1, cnt[i][0]) >= 0):
        item = 0
      if item is None:
        continue
      while self.mem[i] + self.c.memory[0] > self.c.max_memory:
        self.put_w(i)
      src = None
      if item == 0 and i > 0:
        src = (0, 0, i - 1, cnt[i][0])
      if item == 1 and i < d - 1:
        src = (0, 1, i + 1, cnt[i][1])
      if src is not None:
        self._fill_w(i, src, fill=self.fill_f)
      self.put(0, item, i)

  def orders(self) -> list[list[Op]]:
    kinds = "FBW"
    return [[(kinds[cat], chunk if cat == 0 else 1 - chunk, m)
             for cat, chunk, m in seq] for seq in self.seq]


class _Stuck(Exception):
  """The greedy cannot place an action (memory cap or a missing input)."""


def _try_zbv(d: int, n: int, costs: Costs, fill_f: bool, fill_b: bool,
             approved: Sequence[int] | None = None) -> _ZbvGreedy:
  """One greedy pass, then (as the reference does) a second pass that
  approves the first pass' per-device bubbles, kept when it is better."""
  g = _ZbvGreedy(d, n, costs, fill_f, fill_b, approved)
  g.run()
  top = g.max_bubble()
  if approved is None or top < max(approved):
    try:
      again = _try_zbv(d, n, costs, fill_f, fill_b, g.bubble)
      if again.max_bubble() < top:
        return again
    except _Stuck:
      pass
  return g


def zbv_orders(num_devices: int, num_microbatches: int,
               costs: Costs) -> list[list[Op]]:
  """ZB-V (Qi et al., zero-bubble pipeline parallelism; the ZB-V greedy of
  their repository): forwards of the first half fill the warm-up up to the
  memory cap (1F1B's peak by default), then rounds of one backward and one
  forward per device, each device filling a wait for its input with
  deferred Ws; of the four fill policies the one with the smallest largest
  per-device bubble wins.

  Raises:
    ValueError: when no policy places every action (too few micro-batches
      for the memory cap).
  """
  best = None
  for fill_b in (True, False):
    for fill_f in (True, False):
      try:
        g = _try_zbv(num_devices, num_microbatches, costs, fill_f, fill_b)
      except _Stuck:
        continue
      if best is None or g.max_bubble() < best.max_bubble():
        best = g
  if best is None:
    raise ValueError(
        f"ZB-V's greedy places no schedule for {num_microbatches}"
        f" micro-batches on {num_devices} devices under memory"
        f" {costs.max_memory}; use at least {2 * num_devices} micro-batches")
  return best.orders()
