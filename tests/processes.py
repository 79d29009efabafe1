"""A long-running `intentstream` command (worker, deliver) as a real process, its log in a file:
what tests/workers.py and tests/deliverers.py start."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Self


class LoggedProcess:
    """A subprocess of `args` whose stdout and stderr append to `log`."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args, self.log_path = args, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> Self:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        return self

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then wait; returns the exit code (a loaded machine's drain can take 15 s)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """kill -9."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
