"""Commands that do no work start without the heavy imports: `--version`, `--help`, a
sub-command's help, a flag or setting refused. What is imported is checked (sys.modules after
the console script's entry ran), not how long it took: speed is measured, not asserted
(the figures: README, Two commands)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numba", "numpy", "redis", "pydantic")

# argv, what it may import of HEAVY
CASES = [
    (["--version"], set()),
    (["--help"], set()),
    (["rules", "--help"], set()),
    (["model", "--help"], set()),
    (["partitions", "--help"], set()),
    (["score", "--help"], set()),
    (["score", "--batch-size", "0", "--model", "m.npz"], set()),
    (["model", "init", "--help"], {"pydantic"}),  # the declared inputs' flags
    (["model", "init", "--hidden", "0", "--event-types", "a", "--out", "m.npz"], {"pydantic"}),
    (["publish", "--help"], {"pydantic"}),  # settings' flags
    (["rules", "set", "--help"], {"pydantic"}),
    (["rules", "set", "x", "--above", "2"], {"pydantic"}),
    (["worker", "--help"], {"pydantic"}),
    (["worker", "--batch-size", "0"], {"pydantic"}),
]


def imported(argv: list[str]) -> tuple[set[str], str]:
    code = (
        "import json, sys\n"
        "from worker.commands.entry import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    return set(json.loads(result.stderr.strip().splitlines()[-1])), result.stderr


@pytest.mark.integration  # a Python subprocess per case (in imported(), so not marked for us)
@pytest.mark.parametrize(("argv", "allowed"), CASES)
def test_a_command_that_does_no_work_skips_the_heavy_imports(argv, allowed):
    modules, stderr = imported(argv)
    assert modules <= allowed, (argv, modules, stderr)


@pytest.mark.integration  # a Python subprocess (in imported())
def test_a_command_that_needs_no_kernel_starts_without_numba():
    """`model list` loads the registry's code and the artifact's checks, not Numba: a light
    command costs 0.3-0.4 s of CPU less, over the hundreds the tests run (Redis is not there:
    the command fails after its imports)."""
    modules, stderr = imported(["model", "list", "--redis-url", "redis://127.0.0.1:1/0"])
    assert "redis" in modules and "numba" not in modules, (modules, stderr)
