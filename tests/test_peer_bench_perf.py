"""``experiments.peer_bench_perf``: perf samples charged to kinds of code."""

from __future__ import annotations

import pytest

from experiments import peer_bench_perf_lib as pbp

REPORT = """\
# Samples: 1K of event 'cpu-clock'
#
# Period  Shared Object  Symbol
#
 4000000  libjax_common.so  [.] ynn::dot_fp32_5x64x1_1x16x1_avx512
 2000000  [JIT] tid 5660  [.] 0x00007fa385b3a5e9
 1000000  libjax_common.so  [.] ynn::transpose_x32_avx512
  500000  [kernel.kallsyms]  [k] clear_page_erms
  500000  [kernel.kallsyms]  [k] finish_task_switch.isra.0
  500000  libc.so.6  [.] __memmove_avx512_unaligned_erms
  500000  libjax_common.so  [.] xla::cpu::ThunkExecutor::Execute<xla::cpu::ThunkExecutor::FifoReadyQueue>
  500000  libjax_common.so  [.] Eigen::internal::gemm_pack_colmajor_block<float>
  500000  libpython3.11.so.1.0  [.] _PyEval_EvalFrameDefault
"""


def test_samples_are_charged_by_symbol_and_library():
  got = pbp.shares(REPORT)
  assert got["dot (ynn)"] == pytest.approx(0.4)
  assert got["JIT fusions"] == pytest.approx(0.2)
  assert got["transpose"] == pytest.approx(0.1)
  for c in ("page faults", "scheduling/futex", "memcpy/memset",
            "XLA runtime", "dot (Eigen GEMM)", "other"):
    assert got[c] == pytest.approx(0.05), c
  assert sum(got.values()) == pytest.approx(1.0)


def test_table_gives_ms_per_category():
  row = {"variant": "tj_mshape", "cpu_ms": 1500.0, "temp_mb": 79.2,
         "ms": {c: 1500.0 * s for c, s in pbp.shares(REPORT).items()}}
  table = pbp.markdown([row])
  assert "| tj_mshape | 1500 | 79 | 600 | 75 | 150 | 300 |" in table


def test_top_symbols_are_the_hottest_first():
  top = pbp.top_symbols(REPORT, 3)
  assert [s for _, s, _ in top] == [
      "ynn::dot_fp32_5x64x1_1x16x1_avx512", "0x00007fa385b3a5e9",
      "ynn::transpose_x32_avx512"]
  assert [c for c, _, _ in top] == ["dot (ynn)", "JIT fusions", "transpose"]
  assert top[0][2] == pytest.approx(0.4)
