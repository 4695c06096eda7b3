"""Jaxpr-level passes (markers, partition, backward split, lowering); installed as tessel_jax.passes.

Modules, in pipeline order (``tessel_jax.api`` drives them):

* ``boundary``  -- ``tj.boundary``, the identity marker (primitive in
  ``tessel_jax.compat``);
* ``partition`` -- trace ``fn(params, microbatch)``, cut the jaxpr at the
  boundaries into forward blocks, find their inputs/outputs/parameters and
  the epilogue that combines block outputs into the function's outputs;
* ``rows``      -- row coupling: the micro-batch axis followed through a
  block's jaxpr (independent rows, mixed rows, sums over rows);
* ``modes``     -- each block on several devices splits its rows or runs
  replicated (exact either way), chosen from ``rows``; ``align`` pairs the
  per-device re-trace's block outputs with the full trace's by where they
  are computed; ``row_scaling`` handles batch-sized values that do not
  depend on the batch; ``probe_eval`` compiles the probes that evaluate a
  block once (sum ratios, shared aux means) at XLA's lowest level;
* ``kernels``   -- per placement block (F, B, W) the function a device runs
  (``block_vjp``: backward via ``jax.vjp``, keep residuals or recompute;
  gradients and terminals of shared blocks counted once);
* ``packing``   -- parameter layout: slot arrays and flat regions, so each
  device holds only its blocks' parameters;
* ``plan``      -- static tick tables from the unrolled schedule: stash
  stores and pools, read/out ports, message rounds, loops;
* ``interp``    -- table-driven ramps (warmup/cooldown as one loop);
* ``lower``     -- the ``jax.jit(jax.shard_map(...))`` program (``gather``:
  sharded parameters read by blocks on a strict subset of the pipe axis,
  gathered before the first tick, gradient scattered back after the last),
  in parts: ``tick_ctx`` (per-device tables, name scopes), ``lower_context``
  (the lowering's inputs), ``tick_io`` (a tick's message writes, port and
  parameter reads), ``param_grads`` (gradient accumulation),
  ``tick_compute`` (a tick's kernels and terminals), ``tick_runs`` (straight
  runs, flushes, loops, interpreted segments), ``lower_program`` (the map's
  body and ``fn(params, batch)``), ``hoist`` with ``param_only`` (the
  kernels' parameter-only work, e.g. reversed conv weights, computed once
  per step before the ticks);
* ``outputs``   -- the function's outputs (loss, aux stacked per
  micro-batch, inference outputs) from the accumulated terminals;
* ``shared_aux`` -- refuses aux values a row-split block would compute
  differently from ``fn``;
* ``errors``    -- ``TesselError``.
"""
