"""BENCHMARKS.md as a reference (issue 45): each question's section names the command that
reproduces it and the machine it ran on, every flag those commands use exists, and the
README and BENCHMARKS.md stay short enough to read."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import console_script

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
# Sections that frame the page rather than answer a question.
FRAME = {"The machines", "At a glance", "How to run them"}
MACHINES = ("Xeon", "EPYC")
_SPAN = re.compile(r"`([^`]+)`")
_ENV = re.compile(r"^(?:[A-Z_]+=\S+\s+)+")
_COMMAND = re.compile(r"^(?:intentstream |python |bash |\.venv/bin/python )")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_SUB_COMMANDS = {"model", "rules", "partitions"}  # their flags belong to the second word


def sections(page: Path) -> dict[str, str]:
    """Each `## ` section's text by its heading (its `###` subsections included)."""
    parts = re.split(r"^## (.+)$", page.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def quoted_commands(text: str) -> list[str]:
    """Commands quoted in code spans (spans may wrap lines), environment assignments dropped."""
    spans = (_ENV.sub("", " ".join(span.split())) for span in _SPAN.findall(text))
    return [span for span in spans if _COMMAND.match(span)]


def help_command(command: str) -> list[str] | None:
    """The `--help` invocation whose output lists the flags `command` may use."""
    words = command.split()
    if words[0] == "intentstream":
        if words[1] == "bench" and "--workers" in words:
            return [console_script(), "bench", "--workers", "1", "--help"]
        if words[1] == "bench" and "--real" in words:
            return [console_script(), "bench", "--real", "--help"]
        depth = 3 if words[1] in _SUB_COMMANDS and len(words) > 2 else 2
        return [console_script(), *words[1:depth], "--help"]
    if words[:2] == ["python", "-m"]:
        return [sys.executable, "-m", words[2], "--help"]
    if words[0] in ("python", ".venv/bin/python") and words[1].endswith(".py"):
        return [sys.executable, words[1], "--help"]
    return None


def test_every_question_names_its_command_and_machine():
    found = sections(BENCHMARKS)
    questions = {title: text for title, text in found.items() if title not in FRAME}
    assert len(questions) >= 15, sorted(found)
    for title, text in questions.items():
        assert quoted_commands(text), f"BENCHMARKS.md, {title}: no command quoted"
        assert any(machine in text for machine in MACHINES), f"BENCHMARKS.md, {title}: no machine"


def test_the_quoted_commands_use_flags_that_exist():
    """A renamed or dropped flag fails here, not in a reader's shell."""
    wanted: dict[tuple[str, ...], set[str]] = {}
    for command in quoted_commands(BENCHMARKS.read_text()):
        flags = set(_FLAG.findall(command))
        invocation = help_command(command)
        if flags and invocation:
            wanted.setdefault(tuple(invocation), set()).update(flags)
    assert len(wanted) >= 6, wanted  # bench (three parsers), train, the model benches
    missing = []
    for invocation, flags in wanted.items():
        result = subprocess.run(list(invocation), capture_output=True, text=True, cwd=ROOT,
                                timeout=120)  # fmt: skip
        assert result.returncode == 0, (invocation, result.stderr)
        known = set(_FLAG.findall(result.stdout))
        missing += [f"{' '.join(invocation[1:])}: {flag}" for flag in sorted(flags - known)]
    assert not missing, missing


def test_the_reference_pages_stay_short():
    """The issue's bounds: a README a newcomer reads, a BENCHMARKS.md that is not a log."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert len(BENCHMARKS.read_text().splitlines()) <= 600
