"""docs/architecture.md names every module under worker/ and model/ in its module table, and
names none that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `((?:worker|model)[^`]*)` \| `([^`]+\.py)` \|", re.M)


def named() -> set[str]:
    """Each module the table names, as a path from the repository's root."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return {f"{folder}/{name}" for folder, name in ROW.findall(text)}


def modules(top: str) -> set[str]:
    """Every module under `top` but the packages' `__init__.py` (the table names folders)."""
    return {
        str(path.relative_to(ROOT))
        for path in (ROOT / top).rglob("*.py")
        if path.name != "__init__.py"
    }


def test_every_worker_module_is_named_in_the_architecture_table():
    assert sorted(modules("worker") - named()) == []


def test_every_model_module_is_named_in_the_architecture_table():
    assert sorted(modules("model") - named()) == []


def test_the_table_names_no_module_that_is_gone():
    assert sorted(named() - modules("worker") - modules("model")) == []
