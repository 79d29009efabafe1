"""scripts/ab_trees.sh: a command run on an earlier revision's tree and on this one in turn,
each run's lines prefixed with its side, each side's code the one on its PYTHONPATH; the
exported tree is removed afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHERE = "import os, worker; print(os.path.dirname(worker.__file__))"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "ab_trees.sh"), *args],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


@pytest.mark.integration
def test_each_pair_runs_the_base_tree_then_this_one():
    done = run("HEAD", "2", "python", "-c", WHERE)
    assert done.returncode == 0, done.stderr
    runs = [line.split() for line in done.stdout.splitlines() if not line.startswith("==")]
    assert [r[0] for r in runs] == ["base", "this", "base", "this"]
    base, this = Path(runs[0][1]), Path(runs[1][1])
    assert this == ROOT / "worker" and base != this and base.name == "worker"
    assert runs[2][1] == str(base) and not base.exists()  # one export, removed at the end
    headers = [line for line in done.stdout.splitlines() if line.startswith("==")]
    assert headers[0].startswith("== base, pair 1 of 2") and len(headers) == 4


@pytest.mark.integration
def test_without_a_command_it_prints_its_usage_and_fails():
    done = run("HEAD")
    assert done.returncode == 2
    assert "Usage: bash scripts/ab_trees.sh REV PAIRS COMMAND" in done.stdout
