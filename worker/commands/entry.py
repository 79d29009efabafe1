"""The `intentstream` console script: a plain `healthcheck` is answered by the probe without
loading the CLI (a container runs it every 15 s); everything else goes to cli.main.

Ctrl-C (SIGINT) at any moment exits 130 without a traceback: until a command's body runs
(imports, parsing, `--help`), nothing has been written and the process leaves at once; while
it runs, KeyboardInterrupt unwinds it (its `finally` blocks, its own handlers: the worker's
and the demo's stop cleanly) and cli.main turns it into 130; after it, the exit is at once
again (stdout was flushed), until the interpreter's last teardown, which ignores it: Python
would put the default action back there, and die by the signal.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

INTERRUPTED = 130  # as a shell reports a process stopped by Ctrl-C


def _leave(_sig: int, _frame: object) -> None:
    os._exit(INTERRUPTED)


def _ignore_interrupts() -> None:
    # the last exit handler (the first registered): what follows is the interpreter's
    # teardown, where Python resets a Python-level handler to the default (death by SIGINT)
    # but keeps "ignore"
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """Run the console script; return its exit code."""
    signal.signal(signal.SIGINT, _leave)  # first: the imports below take ~1 s on a busy machine
    atexit.register(_ignore_interrupts)  # before any import registers its own: runs last
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["healthcheck"]:
        from worker.commands.probe import plain_healthcheck

        code = plain_healthcheck(args[1:])
        if code is not None:
            return code
    from worker.commands.cli import main as cli_main

    try:
        return cli_main(args, interruptible=True)
    except KeyboardInterrupt:  # in cli.main's own error handling
        return INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, _leave)  # the interpreter's exit: threads joined, flushes
