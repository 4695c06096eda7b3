"""Multi-host: 2 processes x 4 CPU devices run the same pipelined program.

The test launches two copies of this file as workers (``jax.distributed``
on 127.0.0.1, gloo CPU collectives); together they form an 8-device mesh
``("data", "pipe") = (2, 4)`` whose pipe axis spans both processes, or
(case ``tp``) ``("pipe", "data", "model") = (2, 2, 2)``, pipe across the
processes, running a Megatron MLP whose weights are split over ``model``
(``tests/test_tensor_parallel.py``). Each worker prints the loss and
gradients; the test compares them with the single-process result on 8 fake
devices (and with ``jax.value_and_grad``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest
from child_env import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N = 4


def _mesh(jax, np, case):
  devs = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  from jax.sharding import Mesh  # pylint: disable=import-outside-toplevel
  if case == "tp":  # pipe position = process; data x model inside each
    return Mesh(np.array(devs).reshape(2, 2, 2), ("pipe", "data", "model"))
  # Pipe positions 0, 1 on process 0 and 2, 3 on process 1.
  grid = np.array(devs).reshape(2, 2, 2).transpose(1, 0, 2).reshape(2, 4)
  return Mesh(grid, ("data", "pipe"))


def _problem():
  import test_lowering_models as M  # pylint: disable=import-outside-toplevel
  kinds = ["embed", "mixed", "layer", "head"]
  return M, M.chain_fn(kinds), M.make_params(3), M.make_batch(N * 4)


def _run(mesh, case):
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel
  if case == "tp":
    import test_lowering_models as M  # pylint: disable=import-outside-toplevel
    import test_tensor_parallel as T  # pylint: disable=import-outside-toplevel
    params, specs, fn = T.mlp_model()
    batch = T._batch(N * 4, False)  # pylint: disable=protected-access
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(2),
                       num_microbatches=N, plan="1f1b", data_axes=("data",),
                       param_sharding=specs)
  else:
    M, fn, params, batch = _problem()
    step = tj.schedule(fn, mesh=mesh, placement=tj.placements.vshape(4),
                       num_microbatches=N, solver_time_limit_s=20.0,
                       data_axes=("data",))
  loss, grads = step(params, batch)
  return M, fn, params, batch, loss, grads


def _worker(process_id: int, port: int, case: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                             num_processes=2, process_id=process_id)
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  mesh = _mesh(jax, np, case)
  *_, loss, grads = _run(mesh, case)
  # Replicate the results so every process can read them.
  rep = jax.jit(lambda x: x,
                out_shardings=NamedSharding(mesh, PartitionSpec()))
  loss, grads = rep((loss, grads))
  flat = [np.asarray(x.addressable_data(0)).tolist()
          for x in jax.tree_util.tree_leaves((loss, grads))]
  print("RESULT " + json.dumps(flat), flush=True)
  jax.distributed.shutdown()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.parametrize("case", ["vshape", "tp"])
def test_two_processes_match_one_process(case):
  import jax
  import numpy as np
  port = _free_port()
  env = child_env(devices=4, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
      [ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
  # Outputs go to files: a worker blocked on a full stdout pipe would never
  # reach jax.distributed.shutdown, whose barrier the other one waits in.
  logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))
          for _ in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "--worker", str(i),
       str(port), case], stdout=logs[i][0], stderr=logs[i][1], text=True,
      env=env, cwd=ROOT) for i in range(2)]
  outs = []
  for p, (out_f, err_f) in zip(procs, logs):
    try:
      p.wait(timeout=240)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise AssertionError("multi-host workers did not finish in 240 s")
    out_f.seek(0)
    err_f.seek(0)
    out, err = out_f.read(), err_f.read()
    assert p.returncode == 0, err[-3000:]
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    outs.append(json.loads(line[len("RESULT "):]))
  assert outs[0] == outs[1]

  # The same program in this process on 8 fake devices.
  M, fn, params, batch, loss, grads = _run(_mesh(jax, np, case), case)
  local = [np.asarray(x).tolist()
           for x in jax.tree_util.tree_leaves((loss, grads))]
  for a, b in zip(outs[0], local):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                               atol=1e-7)
  ref_loss, ref_grads = M.reference(fn, params, batch, N)
  assert M.max_rel_err(loss, ref_loss) <= 1e-5
  assert M.max_rel_err(grads, ref_grads) <= 1e-5


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--worker":
  sys.path[:0] = [ROOT, HERE]
  _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
