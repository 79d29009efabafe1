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


FIRST_BATCHES = """
import sys
import numpy as np
from numba.core.registry import CPUDispatcher
from model.random_init import random_model
from model.artifact import save_model
from tests.consumers import in_process_consumer
from worker.common.connection import connect
from worker.common.local_redis import LocalRedis
from worker.producers.publisher import publish

def signatures():
    # every kernel of the project's modules loaded so far, and how many signatures it holds
    return {f"{name}.{attr}": len(v.signatures)
            for name, mod in list(sys.modules.items()) if name.split(".")[0] in ("model", "worker")
            for attr, v in list(vars(mod).items()) if isinstance(v, CPUDispatcher)}

inputs = [
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 5.0, "scale": 1.5,
     "session": True},
    {"kind": "categorical", "name": "brand", "buckets": 64, "dim": 4},
    {"kind": "item", "name": "sku", "buckets": 64, "dim": 4},
]
model = random_model(["view", "cart", "purchase"], hidden=8, features=["gap"], inputs=inputs,
                     wide_head=True)
save_model(model, sys.argv[1])
rng = np.random.default_rng(0)
events = [{"user_id": f"u{rng.integers(0, 100)}", "type": str(rng.choice(["view", "cart", "x"])),
           "ts": 1_700_000_000_000 + i * 1000, "price": f"{rng.uniform(1, 500):.2f}",
           "brand": f"b{rng.integers(0, 9)}", "sku": f"s{rng.integers(0, 40)}"}
          for i in range(600)]
for layout in ("full", "lean"):
    with LocalRedis() as server:
        publish(connect(server.url), events, partitions=2)
        consumer = in_process_consumer(server.url, sys.argv[1], partitions=2, batch_size=100,
                                       layout=layout, history_events=16)
        consumer.models.warm_up()  # what the worker runs before its first read
        before = signatures()
        for _ in range(500):
            if consumer.metrics.count("scored") == len(events):
                break
            consumer.tick()
        assert consumer.metrics.count("scored") == len(events), layout
        after = signatures()
        compiled = {k: n for k, n in after.items() if n != before.get(k, 0)}
        assert not compiled, (layout, compiled)
print("ok")
"""


@pytest.mark.integration
def test_a_workers_first_batches_compile_nothing_after_its_warm_up(tmp_path):
    # a model with several declared inputs (histories of several fields), both layouts
    out = subprocess.run([sys.executable, "-c", FIRST_BATCHES, str(tmp_path / "m.npz")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
