"""A catalogue of bad inputs: each gets the library's own error, naming the
field, raised before any solver or JAX work (issue 16).

Solver calls are trapped (``no_solver``): a bad input that reached CP-SAT
fails the test with "solver called" instead of the expected error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap

import pytest
from ortools.sat.python import cp_model

from tessel_jax import checks, make_graph, placements
from tessel_jax.cost import cache as cost_cache
from tessel_jax.graph import BlockGraph, PlacementError
from tessel_jax.schedule import ScheduleError
from tessel_jax.search import prober, search_repetend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_solver(monkeypatch):
  """Makes every CP-SAT solve fail loudly."""

  def trap(*_a, **_k):
    raise AssertionError("solver called before the input was checked")

  monkeypatch.setattr(cp_model.CpSolver, "Solve", trap)
  monkeypatch.setattr(cp_model.CpSolver, "solve", trap, raising=False)
  monkeypatch.setattr(prober, "solve_modulo", trap)


def test_checks_accept_integers_and_whole_floats_only():
  import numpy as np  # pylint: disable=import-outside-toplevel
  assert checks.integer(np.int64(3), "x") == 3
  assert checks.integer(4.0, "x") == 4 and checks.integer(np.float32(2), "x") == 2
  for bad in (2.7, "3", True, np.True_, math.nan, math.inf, None, [1], 1j):
    with pytest.raises(checks.InputError, match="x must be an integer"):
      checks.integer(bad, "x")
  with pytest.raises(checks.InputError, match=r"in \[1, 5\], got 6"):
    checks.integer(6, "x", low=1, high=5)
  assert checks.real(0.5, "t", positive=True) == 0.5
  for bad in (0, -1, math.nan, math.inf, "1", False):
    with pytest.raises(checks.InputError, match="t must be a finite number"):
      checks.real(bad, "t", positive=True)
  assert checks.boolean(np.True_, "b") is True
  with pytest.raises(checks.InputError, match="b must be True or False"):
    checks.boolean(1, "b")


def placement_json() -> dict:
  return {"name": "p", "num_devices": 2,
          "blocks": [{"id": 0, "kind": "F", "span": 1, "memory": 1,
                      "devices": [0]},
                     {"id": 1, "kind": "F", "span": 1, "memory": 1,
                      "devices": [1]},
                     {"id": 2, "kind": "B", "span": 2, "memory": -1,
                      "devices": [1]},
                     {"id": 3, "kind": "B", "span": 2, "memory": -1,
                      "devices": [0]}],
          "edges": [[0, 1], [1, 2], [2, 3]]}


def _block(field, value, index=0):
  return lambda d: d["blocks"][index].__setitem__(field, value)


def _top(field, value):
  return lambda d: d.__setitem__(field, value)


# (mutation of the placement JSON, text the message must contain)
JSON_CASES = {
    "span float": (_block("span", 2.7), "block 0 span"),
    "span string": (_block("span", "3"), "block 0 span"),
    "span bool": (_block("span", True), "block 0 span"),
    "span half": (_block("span", 0.5), "block 0 span"),
    "span nan": (_block("span", math.nan), "block 0 span"),
    "span inf": (_block("span", math.inf), "block 0 span"),
    "span null": (_block("span", None), "block 0 span"),
    "span huge": (_block("span", 10**18), "block 0 span"),
    "span 1e30": (_block("span", 10**30), "block 0 span"),
    "memory half": (_block("memory", 0.5), "block 0 memory"),
    "memory minus half": (_block("memory", -0.5), "block 0 memory"),
    "memory nan": (_block("memory", math.nan), "block 0 memory"),
    "memory huge": (_block("memory", 10**30), "block 0 memory"),
    "memory string": (_block("memory", "1"), "block 0 memory"),
    "id float": (_block("id", 1.2), "blocks[0].id"),
    "id string": (_block("id", "0"), "blocks[0].id"),
    "id negative": (_block("id", -1), "blocks[0].id"),
    "devices string": (_block("devices", "01"), "blocks[0].devices"),
    "devices int": (_block("devices", 0), "blocks[0].devices"),
    "device float": (_block("devices", [0.5]), "block 0 device"),
    "device bool": (_block("devices", [True]), "block 0 device"),
    "kind int": (_block("kind", 3), "kind"),
    "block name int": (_block("name", 5), "block 0 name"),
    "blocks null": (_top("blocks", None), "blocks"),
    "blocks dict": (_top("blocks", {}), "blocks"),
    "block as list": (lambda d: d["blocks"].__setitem__(0, [0, "F", 1, 1,
                                                           [0]]),
                      "blocks[0]"),
    "edges string": (_top("edges", "01"), "edges"),
    "edge as int": (lambda d: d["edges"].__setitem__(0, 5), "edges[0]"),
    "edge too short": (lambda d: d["edges"].__setitem__(0, [0]), "edges[0]"),
    "edge end string": (lambda d: d["edges"].__setitem__(0, ["0", 1]),
                        "edges[0] src"),
    "edge delay float": (lambda d: d["edges"].__setitem__(0, [0, 1, 1.5]),
                         "edge 0->1 delay"),
    "edge delay negative": (_top("edge_delays", [-1, 0, 0]),
                            "edge 0->1 delay"),
    "num_devices string": (_top("num_devices", "two"), "num_devices"),
    "num_devices float": (_top("num_devices", 2.5), "num_devices"),
    "num_devices zero": (_top("num_devices", 0), "num_devices"),
    "num_devices bool": (_top("num_devices", True), "num_devices"),
    "num_devices huge": (_top("num_devices", 10**6), "num_devices"),
    "placement name int": (_top("name", 7), "name"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_bad_placement_json_is_refused_naming_the_field(case, no_solver):
  mutate, field = JSON_CASES[case]
  data = placement_json()
  mutate(data)
  with pytest.raises(PlacementError, match=field.replace("[", r"\[")
                     .replace("]", r"\]").replace(".", r"\.")) as err:
    BlockGraph.from_dict(data)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, field", [
    ('{"name": "p", "num_devices": NaN, "blocks": []}', "NaN"),
    ('{"name": "p", "num_devices": 2, "blocks": [{"id": 0, "kind": "F",'
     ' "span": Infinity, "memory": 0, "devices": [0]}]}', "Infinity"),
    ('{"name": "p", "num_devices": 2, "blocks": [', "does not parse"),
    (b"\xff\xfe{}", "UTF-8"),
    ("[1, 2]", "the placement"),
    (None, "placement JSON text"),
])
def test_bad_placement_json_text_is_refused(text, field, no_solver):
  with pytest.raises(PlacementError, match=field):
    BlockGraph.from_json(text)


GOOD_BLOCKS = [(0, "F", 1, 1, (0,)), (1, "B", 1, -1, (0,))]


@pytest.mark.parametrize("kwargs, field", [
    (dict(blocks=[(0, "F", 2.5, 0, (0,))]), "block 0 span"),
    (dict(blocks=[(0, "F", math.nan, 0, (0,))]), "block 0 span"),
    (dict(blocks=[(0, "F", 1, 1.5, (0,)), (1, "B", 1, -1.5, (0,))]),
     "block 0 memory"),
    (dict(blocks=[(0, "F", 1)]), r"blocks\[0\]"),
    (dict(blocks=[(0, "F", 1, 0, "0")]), "block 0 devices"),
    (dict(blocks=None), "blocks"),
    (dict(edges=5), "edges"),
    (dict(edges=[(0, 1, -2)]), "edge 0->1 delay"),
    (dict(num_devices=0), "num_devices"),
    (dict(num_devices=1.5), "num_devices"),
    (dict(blocks=[(0, "F", 10**7, 1, (0,)), (1, "B", 10**7, -1, (0,))]),
     "add up to"),
])
def test_bad_make_graph_arguments_are_refused(kwargs, field, no_solver):
  args = dict(name="g", num_devices=1, blocks=GOOD_BLOCKS, edges=[(0, 1)])
  args.update(kwargs)
  with pytest.raises(PlacementError, match=field):
    make_graph(**args)


@pytest.mark.parametrize("args, kwargs, field", [
    (("vshape", 2.5), {}, "num_devices"),
    (("vshape", "4"), {}, "num_devices"),
    (("vshape", True), {}, "num_devices"),
    (("vshape", 0), {}, "num_devices"),
    (("vshape", 5000), {}, "num_devices"),
    (("vshape", 4), {"f_span": 1.5}, "f_span"),
    (("vshape", 4), {"b_span": 0}, "b_span"),
    (("vshape", 4), {"mode": "fast"}, "mode"),
    (("vshape", 4), {"mode": None}, "mode"),
    (("interleaved", 4), {"chunks": 1.5}, "chunks"),
    (("interleaved", 4), {"chunks": 10**9}, "chunks"),
    ((3, 4), {}, "unknown placement"),
])
def test_bad_placement_arguments_are_refused(args, kwargs, field, no_solver):
  with pytest.raises(PlacementError, match=field):
    placements.get(*args, **kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(memory_limit=1.5), "memory_limit"),
    (dict(memory_limit=math.nan), "memory_limit"),
    (dict(memory_limit=-1), "memory_limit"),
    (dict(memory_limit=10**30), "memory_limit"),
    (dict(memory_limit="4"), "memory_limit"),
    (dict(memory_limit=True), "memory_limit"),
    (dict(time_limit_s=0), "time_limit_s"),
    (dict(time_limit_s=-1), "time_limit_s"),
    (dict(time_limit_s=math.nan), "time_limit_s"),
    (dict(time_limit_s=math.inf), "time_limit_s"),
    (dict(time_limit_s="5"), "time_limit_s"),
    (dict(num_workers=0), "num_workers"),
    (dict(seed=-1), "seed"),
    (dict(allow_wrap="yes"), "allow_wrap"),
])
def test_bad_search_arguments_are_refused_before_any_solve(kwargs, field,
                                                           no_solver):
  with pytest.raises(checks.InputError, match=field):
    search_repetend(placements.get("vshape", 2), **kwargs)


@pytest.mark.parametrize("devices, field", [
    ([(0, 1.5)], "block 0 device"),
    ([0, "a"], "block 1 devices"),
    ([True, 1], "block 0 devices"),
    ([[]], "block 0 has no devices"),
    ([0, -1], "block 1 device"),
    ("x", "devices must be a list"),
    ([0, None], "block 1 devices"),
])
def test_bad_hand_placements_are_refused(devices, field, no_solver):
  from tessel_jax.hand_placement import Placement  # pylint: disable=import-outside-toplevel
  with pytest.raises(PlacementError, match=field):
    Placement(devices)


def test_search_refuses_a_non_graph(no_solver):
  with pytest.raises(checks.InputError, match="graph"):
    search_repetend(placement_json())


@pytest.fixture(scope="module")
def vshape_schedule():
  return search_repetend(placements.get("vshape", 2), 4, time_limit_s=5)


@pytest.mark.parametrize("n", [2.5, 0, -1, "2", True, math.nan, None,
                               10**9, 200_000])
def test_bad_unroll_counts_are_refused(vshape_schedule, n, no_solver):
  with pytest.raises(ScheduleError, match="num_microbatches"):
    vshape_schedule.unroll(n)


def test_whole_float_counts_are_accepted(vshape_schedule):
  assert vshape_schedule.unroll(4.0).num_microbatches == 4
  graph = BlockGraph.from_dict({**placement_json(), "num_devices": 2.0})
  assert graph.num_devices == 2 and isinstance(graph.num_devices, int)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(num_microbatches=2.5), "num_microbatches"),
    (lambda d: d.update(num_microbatches="4"), "num_microbatches"),
    (lambda d: d.pop("actions"), "'actions'"),
    (lambda d: d.update(actions=5), "actions"),
    (lambda d: d["actions"][0].update(start=1.5), r"actions\[0\]\.start"),
    (lambda d: d["actions"][0].update(start=-1), r"actions\[0\]\.start"),
    (lambda d: d["actions"][0].update(microbatch=99),
     r"actions\[0\]\.microbatch"),
    (lambda d: d["actions"][0].pop("block"), r"actions\[0\] lacks"),
    (lambda d: d.update(memory_limit=math.nan), "memory_limit"),
    (lambda d: d.update(period=0), "period"),
])
def test_bad_schedule_json_is_refused(vshape_schedule, mutate, field):
  from tessel_jax.schedule import UnrolledSchedule  # pylint: disable=import-outside-toplevel
  unrolled = vshape_schedule.unroll(4)
  data = json.loads(unrolled.to_json())
  back = UnrolledSchedule.from_dict(data, unrolled.graph)
  assert back.actions == unrolled.actions and back.period == unrolled.period
  mutate(data)
  with pytest.raises(ScheduleError, match=field):
    UnrolledSchedule.from_dict(data, unrolled.graph)


# --- tj.schedule ----------------------------------------------------------------


def _jax_case():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import tessel_jax as tj  # pylint: disable=import-outside-toplevel

  def f(p, b):
    h = tj.boundary(jnp.tanh(b["x"] @ p["w0"]))
    return (h @ p["w1"]).sum()

  mesh = jax.make_mesh((2,), ("pipe",))
  params = {"w0": jnp.ones((4, 4)), "w1": jnp.ones((4, 4))}
  return tj, jnp, f, mesh, params, {"x": jnp.ones((8, 4))}


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_microbatches=2.5), "num_microbatches"),
    (dict(num_microbatches=10**9), "num_microbatches"),
    (dict(memory_limit=math.nan), "memory_limit"),
    (dict(memory_limit=-5), "memory_limit"),
    (dict(solver_time_limit_s=0), "solver_time_limit_s"),
    (dict(solver_time_limit_s=math.inf), "solver_time_limit_s"),
    (dict(seed=1.5), "seed"),
    (dict(reprofile="yes"), "reprofile"),
])
def test_bad_schedule_options_are_refused(kwargs, field, no_solver):
  tj, _, f, mesh, _, _ = _jax_case()
  from tessel_jax.passes.errors import TesselError  # pylint: disable=import-outside-toplevel
  options = dict(mesh=mesh, placement="vshape", num_microbatches=4)
  options.update(kwargs)
  with pytest.raises(TesselError, match=f"'f': {field}"):
    tj.schedule(f, **options)


@pytest.mark.parametrize("where, value, field, mode", [
    ("params", 1.0, r"params\['w1'\]", "train"),
    ("params", "s", r"params\['w1'\]", "train"),
    ("params", None, "no gradient", "train"),   # None is an empty subtree
    ("params", "int32", r"parameter params\['w1'\] has dtype int32", "train"),
    ("batch", 3.0, r"batch\['x'\]", "train"),
    ("batch", "s", r"batch\['x'\]", "infer"),
])
def test_bad_leaves_are_refused_with_their_path(where, value, field, mode,
                                                no_solver):
  tj, jnp, f, mesh, params, batch = _jax_case()
  from tessel_jax.passes.errors import TesselError  # pylint: disable=import-outside-toplevel
  if value == "int32":
    value = jnp.ones((4, 4), jnp.int32)
  if where == "params":
    params = dict(params, w1=value)
  else:
    batch = dict(batch, x=value)
  step = tj.schedule(f, mesh=mesh, placement="vshape", num_microbatches=4,
                     mode=mode)
  if value is None:  # jax drops None leaves: the function itself fails
    with pytest.raises(Exception):
      step.build(params, batch)
    return
  with pytest.raises(TesselError, match=field):
    step.build(params, batch)


@pytest.mark.parametrize("extra, pattern", [
    ({"temperature": "scalar"},
     r"batch\['temperature'\] is a scalar .*close over it in the function,"
     r" or pass it in params"),
    ({"mask": "short"},
     r"different leading sizes \[6, 8\] \(6: batch\['mask'\]; 8:"
     r" batch\['x'\]\).*pass values shared by the whole batch in params"),
])
def test_batch_leaves_that_do_not_split_are_named_with_a_fix(
    extra, pattern, no_solver):
  tj, jnp, f, mesh, params, batch = _jax_case()
  from tessel_jax.passes.errors import TesselError  # pylint: disable=import-outside-toplevel
  values = {"scalar": jnp.float32(2.0), "short": jnp.ones((6, 4))}
  batch = dict(batch, **{k: values[v] for k, v in extra.items()})
  step = tj.schedule(f, mesh=mesh, placement="vshape", num_microbatches=4)
  with pytest.raises(TesselError, match=pattern):
    step.build(params, batch)


def test_int_params_are_refused_like_value_and_grad_refuses_them():
  tj, jnp, f, mesh, params, batch = _jax_case()
  import jax  # pylint: disable=import-outside-toplevel
  params = dict(params, w1=jnp.ones((4, 4), jnp.int32))
  with pytest.raises(TypeError, match="int32"):
    jax.value_and_grad(f)(params, batch)
  from tessel_jax.passes.errors import TesselError  # pylint: disable=import-outside-toplevel
  step = tj.schedule(f, mesh=mesh, placement="vshape", num_microbatches=4)
  with pytest.raises(TesselError, match="int32"):
    step.build(params, batch)


# --- command line ---------------------------------------------------------------


CLI_CASES = [
    (lambda t: ["--placement=vshape", "--time_limit=nan"], 1, "--time_limit"),
    (lambda t: ["--placement=vshape", f"--plot={t}/x.gif"], 1, "--plot"),
    (lambda t: ["--placement=vshape", f"--output={t}/no/x.json"], 1,
     "--output"),
    (lambda t: [f"--placement_file={t}/inf.json"], 1, "Infinity"),
    (lambda t: [f"--placement_file={t}/inf.json", "--devices=3"], 1,
     "--devices"),
    (lambda t: ["--placement=vshape", "--microbatches=1000000000"], 1,
     "--microbatches"),
    (lambda t: ["--placement=vshape", "--devices=abc"], 1, "--devices"),
    (lambda t: ["--placement=vshape", "--memory=0", "--microbatches=4"], 2,
     "smallest limit"),
    (lambda t: ["-m", "experiments.search_cases", "--time_limit=-1"], 1,
     "--time_limit"),
]


def test_search_cli_reports_user_errors_on_one_line(tmp_path):
  """Each case in its own process (run side by side): the exit code, one
  line on stderr naming the flag or field, no traceback."""
  (tmp_path / "inf.json").write_text(
      '{"name": "x", "num_devices": 1, "blocks": [{"id": 0, "kind": "F",'
      ' "span": Infinity, "memory": 0, "devices": [0]}], "edges": []}')
  (tmp_path / "bin.json").write_bytes(b"\xff\xfe{")
  def command(args):  # another runner when the case starts with -m
    return args if args[0] == "-m" else ["-m", "experiments.search", *args]

  procs = [subprocess.Popen(
      [sys.executable, *command(make(tmp_path))],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for make, _, _ in CLI_CASES]
  for proc, (make, code, text) in zip(procs, CLI_CASES):
    out, err = proc.communicate(timeout=120)
    case = " ".join(make(tmp_path))
    assert proc.returncode == code, (case, err)
    assert "Traceback" not in err + out, (case, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], (case, err)


# Every runner checks its output paths (folders it creates itself allowed)
# before any work: (runner and flags, text of the one stderr line, whether
# the runner gets to main without jax (since session 42 every one does); then
# a stub jax that fails on import proves no jax work ran first).
OUTPUT_CASES = [
    (lambda t: ["experiments.train", f"--output={t}/afile/x.json"],
     "is a file, not a folder", True),
    (lambda t: ["experiments.train", f"--plot={t}/new/x.gif"],
     "--plot", True),
    (lambda t: ["experiments.compare_schedules", f"--output_dir={t}/afile"],
     "--output_dir", True),
    (lambda t: ["experiments.inference", f"--output_dir={t}/afile/sub"],
     "--output_dir", True),
    (lambda t: ["experiments.inference", f"--cache_dir={t}/afile"],
     "--cache_dir", True),
    (lambda t: ["experiments.model_zoo", f"--markdown={t}/table.html"],
     "--markdown", True),
    (lambda t: ["experiments.tp_bench", f"--output={t}/afile/a/b.json"],
     "--output", True),
    (lambda t: ["experiments.search_scaling", f"--output_dir={t}/afile"],
     "--output_dir", True),
    (lambda t: ["experiments.search_cases", f"--output={t}/folder"],
     "is a folder", True),
    (lambda t: ["experiments.frontier_plot", f"{t}/afile/run.json"],
     "picture", True),
]


def test_runners_check_output_paths_before_any_work(tmp_path):
  """Each runner in its own process (side by side): exit 1, one stderr line
  naming the flag, no traceback, nothing written, no jax imported where the
  runner starts without it."""
  (tmp_path / "afile").write_text("x")
  (tmp_path / "folder").mkdir()
  stub = tmp_path / "nojax" / "jax"
  stub.mkdir(parents=True)
  (stub / "__init__.py").write_text(
      "raise RuntimeError('jax imported before the outputs were checked')")
  before = sorted(p.name for p in tmp_path.rglob("*"))
  def env(nojax):
    extra = [str(tmp_path / "nojax")] if nojax else []
    path = os.pathsep.join(extra + [ROOT, os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path)

  procs = [subprocess.Popen(
      [sys.executable, "-m", *make(tmp_path)], env=env(nojax),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for make, _, nojax in OUTPUT_CASES]
  for proc, (make, text, _) in zip(procs, OUTPUT_CASES):
    out, err = proc.communicate(timeout=120)
    case = " ".join(make(tmp_path))
    assert proc.returncode == 1, (case, err)
    assert "Traceback" not in err + out and not out.strip(), (case, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], (case, err)
  assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_check_created_accepts_new_folders_and_refuses_unwritable(
    tmp_path, monkeypatch):
  from absl import app  # pylint: disable=import-outside-toplevel
  from experiments import cli  # pylint: disable=import-outside-toplevel
  cli.check_created(str(tmp_path / "a" / "b" / "x.json"), "--output",
                    suffixes=(".json",))
  cli.check_created(str(tmp_path / "a" / "b"), "--output_dir", folder=True)
  cli.check_created("", "--output")  # '' is no output
  assert not (tmp_path / "a").exists()  # checking creates nothing
  with pytest.raises(app.UsageError, match="--output_dir=.* is a file"):
    (tmp_path / "f").write_text("x")
    cli.check_created(str(tmp_path / "f"), "--output_dir", folder=True)
  monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
  with pytest.raises(app.UsageError, match="--output=.* is not writable"):
    cli.check_created(str(tmp_path / "new" / "x.json"), "--output")


def test_cost_cli_lists_and_clears(tmp_path):
  store = cost_cache.ProfileCache(str(tmp_path))
  store.put("kernel", "k1", _kernel_record())
  (tmp_path / "kernel-k2.json").write_text("{broken")
  run = lambda *a: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "tessel_jax.cost", *a, f"--dir={tmp_path}"],
      capture_output=True, text=True, timeout=60, cwd=ROOT)
  listed = run("--list")
  assert listed.returncode == 0 and "2 records" in listed.stdout
  assert "unreadable" in listed.stdout and "0.5000 ms" in listed.stdout
  cleared = run("--clear")
  assert cleared.returncode == 0 and "removed 2" in cleared.stdout
  assert not list(tmp_path.glob("*.json"))


# --- cost cache -------------------------------------------------------------------


def _kernel_record(**changes):
  rec = {"seconds": 5e-4, "core_seconds": 5e-4, "raw_seconds": 6e-4,
         "host_cores": 2, "temp_bytes": 128, "compile_seconds": 0.1,
         "label": "F0"}
  rec.update(changes)
  return rec


POISON = {
    "seconds string": lambda r: r.update(seconds="abc"),
    "seconds missing": lambda r: r.pop("seconds"),
    "seconds zero": lambda r: r.update(seconds=0.0),
    "seconds huge": lambda r: r.update(seconds=1e6),
    "seconds bool": lambda r: r.update(seconds=True),
    "core_seconds negative": lambda r: r.update(core_seconds=-1.0),
    "raw_seconds null": lambda r: r.update(raw_seconds=None),
    "temp_bytes negative": lambda r: r.update(temp_bytes=-5),
    "temp_bytes float": lambda r: r.update(temp_bytes=1.5),
    "host_cores zero": lambda r: r.update(host_cores=0),
    "compile_seconds string": lambda r: r.update(compile_seconds="x"),
    "key wrong": lambda r: r.update(key="other"),
}


@pytest.mark.parametrize("case", sorted(POISON))
def test_poisoned_kernel_record_is_logged_removed_and_missed(tmp_path, case,
                                                             caplog):
  store = cost_cache.ProfileCache(str(tmp_path))
  rec = dict(_kernel_record(), key="k")
  POISON[case](rec)
  path = tmp_path / "kernel-k.json"
  path.write_text(json.dumps(rec))
  with caplog.at_level(logging.WARNING, logger="tessel_jax.cost"):
    assert store.get("kernel", "k") is None
  assert not path.exists() and store.dropped == [str(path)]
  assert str(path) in caplog.text
  store.put("kernel", "k", _kernel_record())         # measured again
  assert store.get("kernel", "k")["seconds"] == 5e-4


@pytest.mark.parametrize("text", ["", "{", '{"seconds": NaN}', "[1]", "null",
                                  '{"seconds": 1e999}'])
def test_corrupt_or_truncated_record_is_dropped(tmp_path, text):
  store = cost_cache.ProfileCache(str(tmp_path))
  good = json.dumps(dict(_kernel_record(), key="k"))
  path = tmp_path / "kernel-k.json"
  path.write_text(text or good[:len(good) // 2])     # "" -> truncated
  assert store.get("kernel", "k") is None and not path.exists()


@pytest.mark.parametrize("kind, record", [
    ("ticks", {}),
    ("ticks", {"fixed_s": -1.0, "per_byte_s": 0.0}),
    ("link", {"latency_s": 1e-5, "bandwidth_bytes_per_s": 0}),
    ("link", {"latency_s": "x", "bandwidth_bytes_per_s": 1e9}),
])
def test_bad_tick_and_link_records_are_dropped(tmp_path, kind, record):
  store = cost_cache.ProfileCache(str(tmp_path))
  (tmp_path / f"{kind}-k.json").write_text(json.dumps({**record, "key": "k"}))
  assert store.get(kind, "k") is None
  assert not (tmp_path / f"{kind}-k.json").exists()


def test_bad_schedule_cache_record_is_dropped(tmp_path, vshape_schedule):
  from tessel_jax import schedule_cache  # pylint: disable=import-outside-toplevel
  cache = schedule_cache.ScheduleCache(str(tmp_path))
  graph = vshape_schedule.graph
  unrolled = vshape_schedule.unroll(4)
  cache.store("k", vshape_schedule, unrolled)
  assert cache.load("k", graph, 4, 4) is not None
  path = tmp_path / "schedule-k.json"
  record = json.loads(path.read_text())
  record["unrolled"]["actions"][0]["start"] = "abc"
  path.write_text(json.dumps(record))
  assert cache.load("k", graph, 4, 4) is None and not path.exists()


def test_bad_records_are_never_stored(tmp_path):
  store = cost_cache.ProfileCache(str(tmp_path))
  store.put("kernel", "k", _kernel_record(seconds=math.nan))
  assert not list(tmp_path.iterdir())


_RACER = textwrap.dedent("""
    import json, os, sys
    from tessel_jax.cost import cache
    store = cache.ProfileCache(sys.argv[1])
    me = int(sys.argv[2])
    good = {"seconds": 5e-4, "core_seconds": 5e-4, "raw_seconds": 6e-4,
            "host_cores": 2, "temp_bytes": 128, "compile_seconds": 0.1}
    measured = 0
    for i in range(300):
      key = f"k{i % 7}"
      if me == 0 and i % 5 == 0:  # a poisoner writing in place (not atomic)
        with open(store.path("kernel", key), "w") as f:
          f.write('{"seconds": "abc", "key": "%s"}' % key)
      if store.get("kernel", key) is None:
        store.put("kernel", key, good)   # "measure" and store
        measured += 1
    final = [store.get("kernel", f"k{j}") for j in range(7)]
    for j, rec in enumerate(final):
      if rec is None:  # dropped by a racer just now: measure once more
        store.put("kernel", f"k{j}", good)
        rec = store.get("kernel", f"k{j}")
      assert rec is None or rec["seconds"] == 5e-4, rec
    print(json.dumps({"measured": measured, "dropped": len(store.dropped)}))
    """)


def test_three_racing_processes_end_with_good_records(tmp_path):
  procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path),
                             str(i)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for i in range(3)]
  outs = [p.communicate(timeout=120) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
    assert "Traceback" not in err
  stats = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert sum(s["dropped"] for s in stats) >= 1       # poison was seen
  # The poisoner re-measures what it poisoned; the others may have started
  # after it finished (a loaded machine) and found only good records.
  assert stats[0]["measured"] >= 1
  store = cost_cache.ProfileCache(str(tmp_path))
  for j in range(7):
    rec = store.get("kernel", f"k{j}")
    assert rec is None or rec["seconds"] == 5e-4
  assert not list(tmp_path.glob(".tmp-*"))


def test_poisoned_measured_kernel_is_measured_again(tmp_path):
  tj, _, f, mesh, params, batch = _jax_case()

  def report():
    step = tj.schedule(f, mesh=mesh, placement="vshape", num_microbatches=4,
                       cost="measured", cache_dir=str(tmp_path),
                       solver_time_limit_s=5)
    return step.build(params, batch).report

  cold = report()
  assert cold.kernels_measured >= 1
  kernels = sorted(tmp_path.glob("kernel-*.json"))
  rec = json.loads(kernels[0].read_text())
  rec["seconds"] = "abc"
  kernels[0].write_text(json.dumps(rec))
  again = report()
  assert again.kernels_measured == 1
  fixed = json.loads(kernels[0].read_text())
  assert isinstance(fixed["seconds"], float) and fixed["seconds"] > 0


def test_cache_key_text_has_no_colour_codes():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from tessel_jax import compat  # pylint: disable=import-outside-toplevel
  closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0)
  coloured = str(closed.jaxpr.pretty_print(use_color=True))
  assert "\x1b[" in coloured
  plain = compat.plain_text(closed.jaxpr)
  assert "\x1b[" not in plain and "sin" in plain
  eqns = closed.jaxpr.eqns
  text = compat.jaxpr_text(eqns, closed.jaxpr.invars, closed.jaxpr.outvars)
  assert "\x1b[" not in text
