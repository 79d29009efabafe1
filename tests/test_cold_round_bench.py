"""scripts/cold_round_bench.py still goes a round's way to EXEC through the worker's code, for
one partition and for a group of several (it imports internals that may move)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_a_round_of_one_partition_and_one_of_a_group_each_time_every_step():
    path = ROOT / "scripts" / "cold_round_bench.py"
    spec = importlib.util.spec_from_file_location("cold_round_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(3)
    for partitions in (1, 8):
        raw = bench.entries(partitions, rng, 0)
        assert sum(map(len, raw.values())) == 10 and (partitions == 1) == (len(raw) == 1)
        took = bench.one_round(partitions, raw)
        assert len(took) == len(bench.STEPS) and all(t >= 0 for t in took)
