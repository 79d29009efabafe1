"""Offline scores of events, as `intentstream score` gives them, computed in this process: the
command's code from its parsing on (a process of its own costs ~1 s of CPU to import Numba).
The installed script is checked by tests/test_conformance.py and tests/test_cli_model.py."""

from __future__ import annotations

import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path


def offline_scores(model: Path, events: list[dict]) -> list[float]:
    """`intentstream score --model MODEL` on the events, one score per event."""
    from worker.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as folder:
        lines = Path(folder) / "events.jsonl"
        lines.write_text("".join(json.dumps(e) + "\n" for e in events))
        with redirect_stdout(out), redirect_stderr(err):
            code = main(["score", "--model", str(model), str(lines)])
    assert code == 0, err.getvalue()
    return [json.loads(line)["score"] for line in out.getvalue().splitlines()]
