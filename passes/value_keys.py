"""Which named values stay on the devices that made them.

``passes.kernels`` names every value a kernel reads or writes by a key
whose first element says what it is (``"y"`` forward output, ``"r"``
residual, ``"c"`` input cotangent, ``"g"`` summed output cotangent B -> W,
``"h"`` B's hand-over to W). The planner (``passes.plan``) and the cost
model (``cost.measure``) both need to know which of them never travel;
this module is that one answer, with no imports, so either side can read it.
"""

from __future__ import annotations

#: Key kinds read only by the same block's later kernels on the producing
#: devices and rows: residuals (``"r"``) and B's hand-over to W (``"h"``).
DEVICE_LOCAL_KINDS = ("r", "h")


def stays_on_device(key: tuple) -> bool:
  """Whether the value named ``key`` stays on the devices that made it.

  Such values are never sent, and their stores keep the producer's own
  shape rather than the rows their readers need.
  """
  return bool(key) and key[0] in DEVICE_LOCAL_KINDS
