"""The worker's warm-up compiles what a first batch with rules and a lean-layout commit need
(worker/engine/models.py, warm_up_worker_kernels): checked in a fresh process, since the
suite's other tests compile kernels too."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import numpy as np
from worker.engine.models import warm_up_worker_kernels
from worker.engine.compute import lean_state
from worker.rules import step as rules_step
from worker.rules.definition import Rule
warm_up_worker_kernels()
kernels = [lean_state._pack, rules_step._step]  # (_pack's helper _le compiles inside it)
before = {k.__name__: len(k.signatures) for k in kernels}
assert all(before.values()), before  # each compiled (or loaded) by the warm-up
table = rules_step.RuleTable.of([Rule(name="hot", above=0.7, types=["cart"]),
                                 Rule(name="any", above=0.2, cooldown_ms=1000)], version=3)
types = ["view", "cart", "view", "warp"]
type_idx = np.array([0, 1, 0, 2])
allowed = table.allowed(table.type_mask(["view", "cart"]), type_idx, types)
states = rules_step.RuleStates.fresh(3, 2)
rules_step.step(table, states, np.array([-1, 5, 7]), 1800.0, np.array([0, 1, 2, 0]),
                np.array([0.1, 0.9, 0.5, 0.3], np.float32), np.array([1, 2, 3, 4]), allowed)
h = np.zeros((5, 2, 8), np.float32)[1:4]  # a slice of a batch's states, as a commit's rows
cols = [[b"1-0", b"", b"x" * 300]] * 5
lean_state.packed_states(h, np.array([1, 2, 3]), np.array([4, 5, 6], np.int32), cols)
after = {k.__name__: len(k.signatures) for k in kernels}
assert before == after, (before, after)
print("ok")
"""


@pytest.mark.integration
def test_the_warm_up_compiles_the_rules_and_lean_layout_kernels():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
