"""The `intentstream` console script: a plain `healthcheck` is answered by the probe without
loading the CLI (a container runs it every 15 s); everything else goes to cli.main."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the console script; return its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["healthcheck"]:
        from worker.commands.probe import plain_healthcheck

        code = plain_healthcheck(args[1:])
        if code is not None:
            return code
    from worker.commands.cli import main as cli_main  # numpy, Numba, pydantic: ~1.4 s

    return cli_main(args)
