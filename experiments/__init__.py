"""Experiment runners (absl binaries), run from the repository root.

``python -m experiments.search``: search one placement, print and save it.
``python -m experiments.search_cases``: the benchmark over every named
placement, device count, memory limit and mode against the baselines.

Each runner is three modules: ``X.py`` (the binary), ``X_args.py`` (the
flags, read into a NamedTuple) and ``X_lib.py`` (the work; never reads flags,
so tests and notebooks call it directly).
"""
