"""Measured cost model: block profiling -> the search's integers -> report.

Modules, one job each:

* ``measure``  -- compile every kernel alone on the device and time it;
  stash and workspace bytes; bytes on every graph edge (jax);
* ``estimate`` -- kernel seconds from XLA's cost-analysis flops, calibrated
  on the kernels measured so far (screening in ``tessel_jax.plans``);
* ``cache``    -- on-disk JSON cache of measurements, keyed by kernel jaxpr,
  shapes, backend and device kind;
* ``link``     -- communication model ``latency + bytes / bandwidth``,
  defaults per backend, ``ppermute`` microbenchmark;
* ``quantize`` -- seconds and bytes -> integer spans, edge delays and memory
  units, with the rounding error (pure Python);
* ``predict``  -- replay of a schedule with real durations: step time, peak
  memory, bubbles (pure Python);
* ``ticks``    -- what the lowered program adds per tick (barriers, overhead);
* ``stage``    -- the devices of one pipeline stage (GSPMD axes) and the
  specs of the split parameters: where kernels are profiled (jax lazily);
* ``model``    -- ``CostModel``: the options of ``tessel_jax.schedule`` tied
  together (jax);
* ``report``   -- ``CostReport``, what ``step.report`` returns.

Importing this package does not import jax (``measure`` and ``model`` do).
The functions live in their modules (``tessel_jax.cost.quantize.quantize``,
``tessel_jax.cost.predict.predict``); the package exports the classes.
"""

from tessel_jax.cost.link import LinkModel
from tessel_jax.cost.predict import Prediction
from tessel_jax.cost.quantize import Quantized
from tessel_jax.cost.report import CostReport

__all__ = ["CostReport", "LinkModel", "Prediction", "Quantized"]
