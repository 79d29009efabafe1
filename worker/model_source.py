"""Where the worker's model comes from: a pinned file, or the registry's current version
(hot reload). The consumer asks `poll()` between batches, never in the middle of one."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import redis

from model.artifact import file_sha256, load_model
from model.scoring import ScoringModel
from worker.registry import Registry, RegistryError

log = logging.getLogger("intentstream.models")


class ModelRejectedError(Exception):
    """A new current version that failed validation; the running model stays."""

    def __init__(self, version: str, reason: str) -> None:
        super().__init__(f"model version {version} refused: {reason}")
        self.version = version


class FileModelSource:
    """A model file given with --model: loaded once, never swapped."""

    def __init__(self, path: str | Path) -> None:
        model = load_model(path)
        version = model.version if model.version != "file" else f"file-{file_sha256(path)[:12]}"
        self.current = ScoringModel(model, version=version)

    shadow: ScoringModel | None = None  # a pinned file has no challenger

    def poll(self) -> ScoringModel | None:
        """A newer model to swap in, or None."""
        return None

    def close(self) -> None:
        pass


class RegistryModelSource:
    """The registry's current version; follows promotions announced on pub/sub, and polls
    `current` every `poll_seconds` too, since pub/sub drops messages while disconnected."""

    def __init__(self, client: redis.Redis, prefix: str, poll_seconds: float = 2.0) -> None:
        self.registry = Registry(client, prefix)
        version = self.registry.current()
        if version is None:
            raise RegistryError(
                f"no current model in the registry under {prefix!r}: "
                "publish one with `intentstream model publish FILE --promote`, or pass --model"
            )
        self.current = ScoringModel(self.registry.load(version), version=version)
        self._refused: set[str] = set()
        self.shadow: ScoringModel | None = None
        self._follow_shadow()
        self.poll_seconds = poll_seconds
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._next_poll = time.monotonic() + poll_seconds
        self._listener = threading.Thread(
            target=self._listen, args=(client,), name="model-updates", daemon=True
        )
        self._listener.start()

    def _listen(self, client: redis.Redis) -> None:
        while not self._closed.is_set():
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.registry.channel)
                while not self._closed.is_set():
                    if pubsub.get_message(timeout=1.0) is not None:
                        self._wake.set()
            except redis.RedisError:
                self._closed.wait(1.0)  # polling covers the gap

    def poll(self) -> ScoringModel | None:
        """The new current model if `current` moved (and it validates), else None.

        Raises ModelRejectedError once per refused version.
        """
        now = time.monotonic()
        if not self._wake.is_set() and now < self._next_poll:
            return None
        self._wake.clear()
        self._next_poll = now + self.poll_seconds
        self._follow_shadow()
        version = self.registry.current()
        if version is None or version == self.current.version or version in self._refused:
            return None
        try:
            model = self.registry.load(version)
        except RegistryError as exc:
            self._refused.add(version)
            raise ModelRejectedError(version, str(exc)) from None
        self.current = ScoringModel(model, version=version)
        return self.current

    def _follow_shadow(self) -> None:
        """Load the registry's shadow version when it changed (None when there is none; a
        shadow that does not load is logged and skipped: it never stops the worker)."""
        version = self.registry.shadow()
        if version == (self.shadow.version if self.shadow else None):
            return
        if version is None or version in self._refused:
            self.shadow = None
            return
        try:
            self.shadow = ScoringModel(self.registry.load(version), version=version)
        except RegistryError as exc:
            self._refused.add(version)
            self.shadow = None
            log.error("shadow model refused", extra={"version": version, "error": str(exc)})

    def close(self) -> None:
        self._closed.set()
