"""The README's and the guides' commands, run as written (against a Redis the test starts),
and their links, checked."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import redis

from tests.workers import wait_for
from worker.common.local_redis import redis_cli_binary

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PRODUCERS = ROOT / "docs" / "producers.md"  # where the README's Python snippet now lives
# Every page a reader is sent to: its indented commands run, its links resolve.
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "BENCHMARKS.md"]
# Commands these tests cannot run as written, and where they are covered instead.
ELSEWHERE = {
    "bash scripts/test.sh": "this is the test run itself (.ci/run)",
    "bash scripts/demo.sh": "runs until Ctrl-C: tests/test_registry.py runs `intentstream demo`",
    "python3 -m venv": "installation: done by scripts/test.sh",
    "intentstream partitions resize": "needs stopped workers: tests/test_resize.py runs it",
    "intentstream console": "serves until stopped: tests/test_console_browser.py starts it",
    "intentstream bench --workers": "minutes long: tests/test_scaling_bench.py runs it small",
    # the plain `intentstream bench` above it still runs here, every variant
    "intentstream bench --repeat 3 --latency": "tests/test_bench.py runs it small, its output read",
    "intentstream bench --real": "minutes long: tests/test_cli_judging.py runs it small",
    ".venv/bin/python -m pytest": "the test run itself (docs/contributing.md)",
    "intentstream webhooks test": "needs a receiver: tests/test_cli_webhooks.py pings one",
    "intentstream deliver": "runs until SIGTERM: tests/test_webhooks_delivery.py runs it",
    ".venv/bin/ruff": "the lint step of scripts/test.sh",
    ".venv/bin/lint-imports": "the import contracts' step of scripts/test.sh",
}
SAMPLE = ROOT / "tests" / "data" / "rees46_sample.csv"
# Long-running commands get a bound; the rest of each line runs unchanged.
BOUNDED = {
    # a guard only: the test stops the worker once it has committed every entry (run_worker);
    # a SIGTERM waits for the blocking read in hand (1 s by default: a second per run here)
    "intentstream worker": " --max-seconds 300 --metrics-port 0 --block-ms 200",
    "intentstream bench": " --events 3000 --users 300 --subset 300 --repeat 1 --latency-seconds 1",
    # train judges its model against two fitted baselines on the held-out users: on the 60,000
    # events the models guide publishes that took two of this test's 2.2 minutes. A tenth of
    # them runs the same steps (the calibration too: its floor of validation sessions lowered)
    "intentstream publish --synthetic 60000": " --synthetic 6000 --users 300",
    "intentstream train": " --epochs 2 --calibration-min-sessions 100",
    "python -m model.benchmarks.kernels": " --hidden 8 --batch 1 64 --repeats 3",
    "python -m model.benchmarks.training": " --events 5000 --users 300 --epochs 1 --hidden 8",
    "python -m model.benchmarks.calibration": " --users 400 --test-users 300",
    # the REES46 slice is outside the repo (and a clean clone): the bundled sample stands in
    "python -m model.benchmarks.real_shop": f" --seeds 1 --epochs 1 --users 300 --data {SAMPLE}",
}

# Commands that read what a page's worker writes (states, actions): the reader's worker runs
# all along in a second shell, this test's is bounded, so on a page that started one it runs
# once more (bounded) first.
AFTER_THE_WORKER = re.compile(r"intentstream explain |redis-cli (-p \d+ )?XREADGROUP ")


def readme_commands(doc: Path = README) -> list[str]:
    """Shell commands of a page's indented blocks, continuation lines joined."""
    commands, pending = [], ""
    starts = ("intentstream ", "redis-cli ", "printf ", "python ", "python3 ", "bash ", ".venv/")
    for line in doc.read_text().splitlines():
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
    command = re.sub(r"redis://localhost:63\d\d/0", url, command)
    command = re.sub(r"^redis-cli (-p \d+ )?", f"redis-cli -p {port} ", command)
    for prefix, bound in BOUNDED.items():
        if command.startswith(prefix):
            command += bound
    return command


def committed(client: redis.Redis) -> bool:
    """Every event stream's newest entry is its partition's committed position."""
    for key in client.scan_iter("intentstream:events:*"):
        found = re.fullmatch(rb"intentstream:events:\{(\d+)\}", key)
        newest = client.xrevrange(key, count=1) if found else None
        if newest and client.get(b"intentstream:acked:{%s}" % found[1]) != newest[0][0]:
            return False
    return True


def run_worker(shell: str, cwd: Path, env: dict, url: str) -> subprocess.CompletedProcess:
    """A page's worker, stopped with SIGTERM (a reader's Ctrl-C) once it has started and
    committed every entry of the page's events. A fixed --max-seconds 3 counted the worker's
    start: at load 7-9 that took all of it, nothing was scored and `explain` failed."""
    log = cwd / "worker.log"
    with log.open("ab") as out:
        before = out.tell()  # a page's worker may run twice: this run's lines only
        proc = subprocess.Popen(["bash", "-c", f"exec {shell}"], cwd=cwd, env=env,
                                stdout=out, stderr=out)  # fmt: skip
    client = redis.Redis.from_url(url)
    try:
        wait_for(lambda: b"worker started" in log.read_bytes()[before:] and committed(client), 300,
                 f"{shell}: started and every entry committed")  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.close()
    return subprocess.CompletedProcess(
        shell, code, log.read_bytes()[before:].decode(errors="replace"), ""
    )


def server_state(server) -> str:
    """Whether the test's redis-server still runs, and its log's tail: what a failure that
    looks like "connection refused" needs (a new user saw one once; the cause found: another
    process's redis-server held the port at start, which LocalRedis.start now refuses; its sign
    here: "exited with 1" and a bind error)."""
    code = server.process.poll()
    log = Path(server.dir) / "redis.log"
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    state = "running" if code is None else f"exited with {code}"
    return f"the test's redis-server ({server.url}): {state}; its log ends:\n" + "\n".join(tail)


def test_every_readme_command_runs(redis_server, tmp_path):
    """Every page's commands in order, each page from an empty Redis and its own directory."""
    pages = {doc: readme_commands(doc) for doc in DOCS}
    commands = [c for page in pages.values() for c in page]
    assert len(commands) > 15
    bin_dir = Path(sys.executable).parent
    cli = redis_cli_binary()
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}:{Path(cli).parent}:{env['PATH']}"
    env["INTENTSTREAM_REDIS_URL"] = redis_server.url
    env["INTENTSTREAM_METRICS_PORT"] = "0"
    ran = 0
    for doc, page in pages.items():
        redis.Redis.from_url(redis_server.url).flushall()
        cwd = tmp_path / doc.stem
        cwd.mkdir()
        (cwd / "events.jsonl").write_text(
            "".join(json.dumps({"user_id": f"u{i}", "type": "view"}) + "\n" for i in range(20))
        )
        worker = None  # the page's worker command, as run here
        for command in page:
            if any(command.startswith(p) for p in ELSEWHERE):
                continue
            if command.startswith("intentstream worker"):
                # the worker needs a model: the pages create model.npz (or a registry version)
                subprocess.run(
                    "intentstream model init --event-types view,add_to_cart,coupon,purchase "
                    "--out model.npz", shell=True, cwd=cwd, env=env, check=True,
                    capture_output=True,
                )  # fmt: skip
            if worker and AFTER_THE_WORKER.match(command):
                again = run_worker(worker, cwd, env, redis_server.url)
                assert again.returncode == 0, f"{worker}\n{again.stdout}"
            shell = as_run_here(command, redis_server.url, redis_server.port)
            if command.startswith("intentstream worker"):
                worker = shell
                result = run_worker(shell, cwd, env, redis_server.url)
            else:
                result = subprocess.run(
                    ["bash", "-c", shell], cwd=cwd, env=env, capture_output=True, text=True,
                    timeout=300,
                )  # fmt: skip
            where = doc.relative_to(ROOT)
            assert result.returncode == 0, (
                f"{where}: {shell}\n{result.stdout}\n{result.stderr}\n" + server_state(redis_server)
            )
            ran += 1
    assert ran >= 15


def test_readme_python_snippet_runs(redis_server):
    text = PRODUCERS.read_text()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    exec(
        compile(snippet.replace("redis://localhost:6379/0", redis_server.url), "README", "exec"), {}
    )
    from worker.common.connection import connect

    assert connect(redis_server.url).xlen("intentstream:events:{0}") == 1


# ---- links ---------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (before de-duplication)."""
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page, repeated headings numbered -1, -2 as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)#*$", _FENCE.sub("", page.read_text()), re.M):
        anchor = github_anchor(heading)
        n = seen.get(anchor, 0)
        seen[anchor] = n + 1
        found.add(anchor if n == 0 else f"{anchor}-{n}")
    return found


def links(page: Path) -> list[str]:
    """Targets of a page's Markdown links, outside code blocks and code spans."""
    text = re.sub(r"`[^`\n]*`", "", _FENCE.sub("", page.read_text()))
    return _LINK.findall(text)


def test_github_anchor_rules():
    assert github_anchor("Choosing a cell: Elman (`rnn`) or GRU (`gru`)") == (
        "choosing-a-cell-elman-rnn-or-gru-gru"
    )
    assert github_anchor("Model artifacts and the registry") == "model-artifacts-and-the-registry"


def test_every_relative_link_and_anchor_resolves():
    assert len(DOCS) >= 9, DOCS  # README, BENCHMARKS and the seven guides
    broken = []
    for page in DOCS:
        for target in links(page):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if ROOT not in (resolved, *resolved.parents) or not resolved.exists():
                broken.append(f"{where}: no such file in the repository")
            elif anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved)):
                broken.append(f"{where}: no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_contract_has_the_headings_code_points_at():
    found = anchors(ROOT / "docs" / "contract.md")
    for anchor in ("the-model", "events-in", "user-state-and-scores-out",
                   "model-artifacts-and-the-registry", "training-data-and-labels", "metrics",
                   "settings", "deploy"):  # fmt: skip
        assert anchor in found, anchor


def test_the_quick_start_model_knows_every_type_the_synthetic_events_send():
    """The quick start's model and `publish --synthetic` agree: no synthetic event scores as
    an unknown type (once 794 of ~3,000 did, visible only in a counter)."""
    from model.data.synthetic import EVENT_TYPES, LABEL_TYPE

    init = next(c for c in readme_commands() if c.startswith("intentstream model init"))
    known = set(re.search(r"--event-types (\S+)", init).group(1).split(","))
    assert {*EVENT_TYPES, LABEL_TYPE} <= known, sorted({*EVENT_TYPES, LABEL_TYPE} - known)
