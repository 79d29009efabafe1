"""The registry's current model as a ScoringModel, loaded once per version (the user pages
and the backtests replay events through it)."""

from __future__ import annotations

import threading

from model.scoring import ScoringModel
from worker.lifecycle.registry import Registry


class CurrentModel:
    """The current version's ScoringModel; a promotion is seen at the next call."""

    def __init__(self, registry: Registry, max_bytes: int) -> None:
        self.registry, self.max_bytes = registry, max_bytes
        self._loaded: tuple[str, ScoringModel] | None = None
        self._lock = threading.Lock()

    def get(self) -> ScoringModel | None:
        """The current model (None: the registry has none)."""
        version = self.registry.current()
        if version is None:
            return None
        with self._lock:
            if self._loaded is None or self._loaded[0] != version:
                model = self.registry.load(version, self.max_bytes)
                self._loaded = (version, ScoringModel(model, version=version))
            return self._loaded[1]
