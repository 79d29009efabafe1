"""`intentstream bench --webhooks`, small: it names the machine, delivers a backlog and a
fixed rate, and prints the rate and the delays it measured."""

from __future__ import annotations

import re

from tests.conftest import run_cli


def test_webhook_bench_runs_small():
    result = run_cli("bench", "--webhooks", "--actions", "300", "--rate", "50", "--seconds", "1",
                     "--senders", "2", timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("machine: ") and "CPUs" in lines[0]
    backlog = (r"backlog of 300: [\d,]+ deliveries/s, deliverer CPU [\d,]+ us per delivery "
               r"\(receiver [\d,]+ us\)")  # fmt: skip
    assert re.fullmatch(backlog, lines[1]), lines[1]
    assert re.fullmatch(r"50 actions/s for 1 s \(50\): commit to arrival p50 [\d.]+ ms, "
                        r"p99 [\d.]+ ms, max [\d.]+ ms", lines[2]), lines[2]  # fmt: skip
