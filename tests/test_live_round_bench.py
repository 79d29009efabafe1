"""scripts/live_round_bench.py still runs a live round through the worker's code: its default
steps still name functions that exist, every event published is scored, each step's time is
reported (it times internals that may move), and so are Redis's share of a round, with
--reader the latency the bench's reader of the scores sees, and with --timeline when each send
went and its reply came."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.integration


def test_a_short_live_run_scores_every_event_and_times_each_step():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "live_round_bench.py"), "--partitions", "2",
         "--rate", "400", "--seconds", "1", "--reader", "--timeline"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    head = re.search(r"(\d+) rounds that scored, (\d+) events; entry to score p50 ([\d.]+) ms",
                     run.stdout)  # fmt: skip
    assert head, run.stdout
    rounds, events, p50 = int(head[1]), int(head[2]), float(head[3])
    assert events >= 380 and rounds >= 50 and 0 <= p50 < 1000
    steps = dict(
        (name, float(us))
        for us, _, name in re.findall(r"^\s+(\d+)\s+(\d+)\s+(\S+)$", run.stdout, re.M)
    )
    # Redis's share: its CPU a round, and the commit's EXEC among its commands
    redis_cpu = re.search(r"Redis: (\d+) µs of CPU a round", run.stdout)
    assert redis_cpu and int(redis_cpu[1]) > 0, run.stdout
    rows = re.findall(r"^\s+([\d.]+)\s+([\d.]+)\s+([a-z|]+)$", run.stdout, re.M)
    commands = {name: (float(us), float(calls)) for us, calls, name in rows}
    assert commands["exec"][0] > 0 and commands["exec"][1] >= 1
    assert steps["tick"] > 0
    assert steps["worker.engine.flow:BatchFlow.together_on_nodes"] > 0  # 4 events, 2 partitions
    assert steps["worker.engine.models:Models.build_group"] > 0
    # the reader saw every score, each event stamped with its send time
    reader = re.search(r"reader: (\d+) scores seen, from the producer's send p50 ([\d.]+) ms",
                       run.stdout)  # fmt: skip
    assert reader and int(reader[1]) == events and 0 < float(reader[2]) < 1000, run.stdout
    # the timeline: the producer's send before the wake, then the round's sends, EXEC's last
    timeline = re.search(
        r"timeline: .* \((\d+) rounds\)\n((?:\s+-?\d+\s+\d+\s+.+\n?)+)", run.stdout
    )
    assert timeline and int(timeline[1]) > 0, run.stdout
    marks = {name: float(us) for us, _, name in re.findall(r"^\s+(-?\d+)\s+(\d+)\s+(.+)$",
                                                           timeline[2], re.M)}  # fmt: skip
    assert marks["the producer's send"] < 0 < marks["send: MULTI"], timeline[2]
