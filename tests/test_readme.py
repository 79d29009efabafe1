"""The README's commands, run as written (against a Redis the test starts)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from worker.common.local_redis import redis_server_binary

README = Path(__file__).resolve().parent.parent / "README.md"
# Commands these tests cannot run as written, and where they are covered instead.
ELSEWHERE = {
    "bash scripts/test.sh": "this is the test run itself (.ci/run)",
    "bash scripts/demo.sh": "runs until Ctrl-C: tests/test_registry.py runs `intentstream demo`",
    "python3 -m venv": "installation: done by scripts/test.sh",
    "intentstream partitions resize": "needs stopped workers: tests/test_resize.py runs it",
    "intentstream bench --workers": "minutes long: tests/test_scaling_bench.py runs it small",
}
# Long-running commands get a bound; the rest of each line runs unchanged.
BOUNDED = {
    "intentstream worker": " --max-seconds 3 --metrics-port 0",
    "intentstream bench": " --events 3000 --users 300 --subset 300",
    "python -m model.bench": " --hidden 8 --batch 1 64 --repeats 3",
    "python -m model.train_bench": " --events 5000 --users 300 --epochs 1 --hidden 8",
}


def readme_commands() -> list[str]:
    """Shell commands of the README's indented blocks, continuation lines joined."""
    commands, pending = [], ""
    starts = ("intentstream ", "redis-cli ", "printf ", "python ", "python3 ", "bash ", ".venv/")
    for line in README.read_text().splitlines():
        if not line.startswith("    "):
            pending = ""
            continue
        text = re.sub(r"\s{2,}#.*$", "", line.strip())  # trailing comments
        if pending:
            pending += " " + text
        elif text.startswith(starts):
            pending = text
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        commands.append(pending)
        pending = ""
    return commands


def as_run_here(command: str, url: str, port: int) -> str:
    """The command with optional [--flags] kept, other [placeholders] dropped, our Redis."""
    command = re.sub(r"\[(--[^\]]*)\]", r"\1", command)
    command = re.sub(r"\s\[[^\]]*\]", "", command)
    command = command.replace("redis://localhost:6379/0", url)
    command = re.sub(r"^redis-cli ", f"redis-cli -p {port} ", command)
    for prefix, bound in BOUNDED.items():
        if command.startswith(prefix):
            command += bound
    return command


def test_every_readme_command_runs(redis_server, tmp_path):
    commands = readme_commands()
    assert len(commands) > 15
    bin_dir = Path(sys.executable).parent
    cli = shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{Path(cli).parent}:{env['PATH']}"
    env["INTENTSTREAM_REDIS_URL"] = redis_server.url
    env["INTENTSTREAM_METRICS_PORT"] = "0"
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps({"user_id": f"u{i}", "type": "view"}) + "\n" for i in range(20))
    )
    ran = 0
    for command in commands:
        if any(command.startswith(p) for p in ELSEWHERE):
            continue
        if command.startswith("intentstream worker"):
            # the worker needs a model: the README creates model.npz further down
            subprocess.run(
                "intentstream model init --event-types view,add_to_cart,coupon,purchase "
                "--out model.npz", shell=True, cwd=tmp_path, env=env, check=True,
                capture_output=True,
            )  # fmt: skip
        shell = as_run_here(command, redis_server.url, redis_server.port)
        result = subprocess.run(
            ["bash", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, f"{shell}\n{result.stdout}\n{result.stderr}"
        ran += 1
    assert ran >= 15


def test_readme_python_snippet_runs(redis_server):
    text = README.read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(
        compile(snippet.replace("redis://localhost:6379/0", redis_server.url), "README", "exec"), {}
    )
    from worker.common.connection import connect

    assert connect(redis_server.url).xlen("intentstream:events:{0}") == 1
