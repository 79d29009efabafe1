"""Every Python script in scripts/ still imports: they reach into the worker's and the model's
modules by name, so a module moved or renamed breaks them unseen until someone runs one (the
outside checks run by hand; random_model's move once broke one that way)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_the_script_imports(path: Path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # each runs its work under `__main__` only
    assert callable(getattr(module, "main", None)), f"{path.name}: no main()"
