"""Where the worker's model comes from. A pinned file for now; the registry (hot reload)
plugs in behind the same two calls."""

from __future__ import annotations

from pathlib import Path

from model.artifact import file_sha256, load_model
from model.scoring import ScoringModel


class FileModelSource:
    """A model file given with --model: loaded once, never swapped."""

    def __init__(self, path: str | Path) -> None:
        model = load_model(path)
        version = model.version if model.version != "file" else f"file-{file_sha256(path)[:12]}"
        self.current = ScoringModel(model, version=version)

    def poll(self) -> ScoringModel | None:
        """A newer model to swap in between batches, or None."""
        return None
