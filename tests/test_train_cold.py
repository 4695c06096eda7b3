"""experiments.train_cold: the main job's cold start read off its output."""

from __future__ import annotations

import sys

from experiments import train_cold_lib as lib

_FAKE = '''
import sys, time
print("I1126 train_args.py:79] train: mshape on 4 devices; importing jax", flush=True)
print("I1126 progress.py:51] schedule('gpt_loss'): kernels 0.42 s (10 kernels)", flush=True)
print("I1126 progress.py:51] schedule('gpt_loss'): search on uniform spans 2.40 s (x)", flush=True)
print("built in 6.1 s; compiling the pipelined step ...", flush=True)
print("schedule (tessel): makespan 105, lowered as interp(82) ticks", flush=True)
print("step   0  loss 4.6374  (131 ms)", flush=True)
time.sleep(60)   # the check and the other steps: never waited for
print("step   1  loss 4.0", flush=True)
'''


def test_marks_of_the_job_lines():
  assert lib.mark_of("I1126 12:18:29.05 1 progress.py:51] schedule('gpt_loss'):"
                     " cut 0.10 s (5 forward blocks)") == "cut"
  assert lib.mark_of("... schedule('f'): search on uniform spans 8.40 s (l)"
                     ) == "search on uniform spans"
  assert lib.mark_of("step   0  loss 4.5569  (382 ms)") == "step 0"
  assert lib.mark_of("step  10  loss 2.9651  (101 ms)") is None
  assert lib.mark_of("built in 19.7 s; compiling the pipelined step ...") == (
      "built")
  assert lib.mark_of("vocab 98, 207360 parameters") is None


def test_a_run_is_timed_to_step_0_and_stopped_there(tmp_path):
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "__init__.py").write_text("")
  (tmp_path / "experiments" / "train.py").write_text(_FAKE)
  row = lib.run_once(sys.executable, str(tmp_path), [])
  marks = row["marks"]
  assert list(marks) == ["first line", "kernels", "search on uniform spans",
                         "built", "compiled", "step 0"]
  assert marks["step 0"][0] < 30          # stopped, not waited for
  assert "error" not in row and row["step0_line"].startswith("step   0")
  line = lib.summary({"version": "v", **row})
  assert line.startswith("v (load ") and "step 0 " in line
