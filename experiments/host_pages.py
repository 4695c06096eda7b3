"""glibc malloc settings that keep XLA CPU's per-call buffers' pages.

XLA's CPU runtime allocates each device's temp buffer (one block of
``compiled.memory_analysis().temp_size_in_bytes``) and its outputs with
``malloc`` at every call and frees them after. glibc serves a block over its
mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns it with
``munmap``, so every call of a program whose temp is larger page-faults
that whole block again (ResNet18 on ``vshape(2)``: 57 MB temp per device,
13,900 minor faults per device and step, traced with ``strace``). A
per-thread arena's heap that falls empty is unmapped too.

No program can keep these pages (the allocation is the runtime's), but the
process can: with one arena, no mmap and no trimming, glibc reuses the
freed blocks and a step touches no fresh page once the heap has grown to
the step's working set (after 2-4 calls). The cost is that the process
never returns that memory to the system. ``GLIBC_TUNABLES`` is read when a
process starts, so it is set for a child process (``env``).
"""

from __future__ import annotations

import os

#: One arena, no mmap, no trimming (glibc >= 2.26 tunables).
KEEP_PAGES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
              "glibc.malloc.trim_threshold=17179869184")


def env(keep_pages: bool, base: dict[str, str] | None = None
        ) -> dict[str, str]:
  """The environment of a child process, ``GLIBC_TUNABLES`` set to
  :data:`KEEP_PAGES` when ``keep_pages`` (else left as in ``base``).

  Args:
    keep_pages: Keep malloc's pages between calls.
    base: The environment to start from (default: this process's).
  """
  out = dict(os.environ if base is None else base)
  if keep_pages:
    old = out.get("GLIBC_TUNABLES")
    out["GLIBC_TUNABLES"] = f"{old}:{KEEP_PAGES}" if old else KEEP_PAGES
  return out
