"""Ctrl-C (SIGINT) at any moment of the installed script: exit 130, at most one line on
stderr, never a traceback. The moments are reached by conditions, not by sleeps: the process
has mapped a library the imports load (it is mid-import), or its command has written to
Redis (it is in the command's body)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import console_script
from tests.workers import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps"),
]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([console_script(), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def mapped(proc: subprocess.Popen, needle: str) -> bool:
    """The process has loaded a shared library whose path holds `needle`."""
    return needle in Path(f"/proc/{proc.pid}/maps").read_text()


def interrupt(proc: subprocess.Popen) -> str:
    """SIGINT; the run must end with 130 and at most one line, no traceback."""
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    return err


@pytest.mark.parametrize(
    ("args", "library"),
    [
        (["score", "--model", "MODEL"], "/numpy/"),  # the imports of a kernel command
        (["score", "--model", "MODEL"], "/numba/"),
        (["model", "list", "--redis-url", "redis://127.0.0.1:1/0"], "/pydantic_core/"),
    ],
)
def test_ctrl_c_during_the_imports_exits_130_quietly(args, library, golden_path):
    proc = start(*[str(golden_path) if a == "MODEL" else a for a in args])
    try:
        wait_for(lambda: mapped(proc, library) or proc.poll() is not None, 60, library)
        if proc.poll() is not None:  # done before the signal: nothing to test at this point
            pytest.skip(f"the run ended before {library} was seen")
        interrupt(proc)
    finally:
        proc.kill()
        proc.wait(10)


def test_ctrl_c_in_a_commands_body_exits_130_quietly(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    proc = start("publish", "--synthetic", "1000000", "--rate", "20",
                 "--redis-url", redis_server.url)  # fmt: skip
    try:
        wait_for(lambda: client.xlen("intentstream:events:{0}") > 0, 60, "an event published")
        interrupt(proc)
    finally:
        proc.kill()
        proc.wait(10)


def test_the_entry_leaves_at_once_until_the_command_runs():
    # in a process of its own: the entry's handler exits; pytest's stays untouched
    code = (
        "import os, signal\n"
        "from worker.commands import entry\n"
        "signal.signal(signal.SIGINT, entry._leave)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('not reached')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "")


def test_after_the_command_ctrl_c_still_exits_130_and_the_teardown_ignores_it():
    code = (
        "import atexit, os, signal, sys\n"
        "from worker.commands import entry\n"
        "try:\n"
        "    entry.main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stdout.flush()\n"
        "os.kill(os.getpid(), signal.SIGINT)  # the command done: leave at once, 130\n"
        "print('not reached')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert (result.returncode, result.stderr) == (130, ""), result.stderr
    assert result.stdout.startswith("intentstream ") and "not reached" not in result.stdout
    # the last exit handler: SIGINT ignored from there (Python's teardown would reset a Python
    # handler to the default action: death by the signal instead of an exit code)
    code = (
        "import os, signal\n"
        "from worker.commands import entry\n"
        "entry._ignore_interrupts()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('ignored')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "ignored\n"), result.stderr
