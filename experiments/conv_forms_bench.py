"""One convolution's forward, weight and input gradient inside a branch.

  python -m experiments.conv_forms_bench --rounds=7

XLA:CPU single-threaded (as each device of the placed benchmarks). For
ResNet18-like shapes (4 rows, 16x16 images: maps 8x8 to 2x2) each of the
three convolutions of one layer is compiled three ways and timed in
shuffled rounds (process CPU ms per call, median): ``top`` as JAX emits it
at the top level of a ``jit`` (XLA canonicalises it there), ``branch`` the
same inside a ``lax.cond`` branch (as the ticks run kernels: XLA leaves it
as it is), ``conv_forms`` inside the branch through
``passes.conv_forms.conv`` (canonical order, im2col dot where XLA would
swap operands). Weights enter as given: what a kernel's hoisted prelude
computes once per step (the weight's reverse and transpose) is timed per
call here.
"""

import collections
import json
import os
import random
import re
import resource
import statistics

from absl import flags

from experiments import cli, runs, xla_env

flags.DEFINE_integer("rounds", 7, "Shuffled rounds (each form once each).")
flags.DEFINE_integer("calls", 10, "Calls per timing.")
flags.DEFINE_string("output", "out/conv_forms_bench.json",
                    "Where to write the JSON results ('': stdout only).")

#: (rows, map side, in channels, out channels, kernel side, stride).
SHAPES = ((4, 8, 64, 64, 3, 1), (4, 4, 64, 128, 3, 2), (4, 4, 128, 128, 3, 1),
          (4, 2, 128, 128, 3, 1), (4, 2, 128, 256, 3, 2),
          (4, 16, 3, 64, 7, 2))


def _cpu_ms(fn, args, calls):
  import jax  # pylint: disable=import-outside-toplevel
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(calls):
    jax.block_until_ready(fn(*args))
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return 1e3 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / calls


def _forms(which, x, w, ct, stride):
  """``{form: (jitted fn, dim_labels)}`` of one convolution."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from jax import lax  # pylint: disable=import-outside-toplevel
  from tessel_jax.passes import conv_forms  # pylint: disable=import-outside-toplevel

  def plain(x, w):
    return lax.conv_general_dilated(
        x, w, (stride, stride), "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"))
  eqn = [e for e in jax.make_jaxpr(plain)(x, w).jaxpr.eqns
         if e.primitive.name == "conv_general_dilated"][0]
  forward = {"plain": plain,
             "conv_forms": lambda x, w: conv_forms.conv(x, w, eqn)}

  def body(conv):
    if which == "forward":
      return lambda x, w, ct: conv(x, w)
    k = 1 if which == "weight_grad" else 0
    return lambda x, w, ct: jax.vjp(conv, x, w)[1](ct)[k]
  out = {}
  for form, conv, branch in (("top", forward["plain"], False),
                             ("branch", forward["plain"], True),
                             ("conv_forms", forward["conv_forms"], True)):
    f = body(conv)
    if branch:
      shape = jax.eval_shape(f, x, w, ct)
      f = (lambda f, shape: lambda x, w, ct: lax.cond(
          x[0, 0, 0, 0] > -1e30, lambda: f(x, w, ct),
          lambda: jnp.zeros(shape.shape, shape.dtype)))(f, shape)
    fn = jax.jit(f)
    text = fn.lower(x, w, ct).compile().as_text()
    out[form] = (fn, re.findall(r" convolution\([^\n]*dim_labels=([^,\s]+)",
                                text))
  return out


def main(argv):
  cli.no_arguments(argv)
  f = flags.FLAGS
  cli.check_created(f.output, "--output", suffixes=(".json",))
  xla_env.add_xla_flags(xla_env.cpu_flags(1, single_thread=True))
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  rows = []
  loads = []
  for n, side, cin, cout, k, stride in SHAPES:
    x = jax.numpy.asarray(rng.normal(size=(n, side, side, cin)), np.float32)
    w = jax.numpy.asarray(rng.normal(size=(k, k, cin, cout)), np.float32)
    out_side = -(-side // stride)
    ct = jax.numpy.asarray(rng.normal(size=(n, out_side, out_side, cout)),
                           np.float32)
    for which in ("forward", "weight_grad", "input_grad"):
      forms = _forms(which, x, w, ct, stride)
      want = np.asarray(forms["top"][0](x, w, ct))
      for form, (fn, _) in forms.items():
        got = np.asarray(fn(x, w, ct))
        err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
        if err > 1e-5:
          raise AssertionError(f"{which} {form}: rel. error {err}")
      times = collections.defaultdict(list)
      for _ in range(f.rounds):
        order = list(forms)
        random.shuffle(order)
        for form in order:
          times[form].append(_cpu_ms(forms[form][0], (x, w, ct), f.calls))
        loads.append(os.getloadavg()[0])
      row = {"x": [n, side, side, cin], "w": [k, k, cin, cout],
             "stride": stride, "conv": which}
      for form, (_, labels) in forms.items():
        row[form] = {"cpu_ms": round(statistics.median(times[form]), 3),
                     "dim_labels": labels}
      rows.append(row)
      print(json.dumps(row), flush=True)
  out = {"rows": rows, "load_average": [round(min(loads), 1),
                                        round(max(loads), 1)]}
  table = markdown(out)
  print(table, flush=True)
  if f.output:
    runs.write_record(f.output, out, table)


def markdown(out):
  """One line per convolution: CPU ms per form (XLA's dim_labels)."""
  lines = ["| x | w, stride | conv | top | branch | conv_forms in the branch"
           " | load |", "|---|---|---|---|---|---|---|"]
  load = out["load_average"]
  for r in out["rows"]:
    cells = [f"{r[k]['cpu_ms']:.3f} ({', '.join(r[k]['dim_labels']) or 'dot'})"
             for k in ("top", "branch", "conv_forms")]
    lines.append(f"| {r['x']} | {r['w']}, {r['stride']} | {r['conv']} | "
                 + " | ".join(cells) + f" | {load[0]}-{load[1]} |")
  return "\n".join(lines)


if __name__ == "__main__":
  cli.run(main)
