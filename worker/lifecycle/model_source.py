"""Where the worker's model comes from: a pinned file, or the registry's current version
(hot reload). The consumer asks `poll()` between batches, never in the middle of one.

Registry models are downloaded, validated and warmed up on a background thread, so a slow
or huge artifact never delays the worker's loop (and its lease renewals): `poll()` only
hands over a model that is ready."""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path

import redis

from model.artifact import file_version, load_model
from model.scoring import ScoringModel
from worker.common.announcements import start_listener
from worker.common.connection import refresh_topology
from worker.lifecycle.registry import NoSuchVersionError, Registry, RegistryError

log = logging.getLogger("intentstream.models")

DEFAULT_MAX_MODEL_BYTES = 64 * 2**20  # Settings.max_model_bytes
_UNCHANGED = object()


class ModelRejectedError(Exception):
    """A new current version that failed validation; the running model stays."""

    def __init__(self, version: str | None, reason: str) -> None:
        what = f"model version {version}" if version is not None else "the current model"
        super().__init__(f"{what} refused: {reason}")
        self.version = version
        self.reason = reason


class FileModelSource:
    """A model file given with --model: loaded once, never swapped."""

    def __init__(self, path: str | Path, raw: bool = False) -> None:
        model = load_model(path)
        self.current = ScoringModel(model, version=file_version(model, path), raw=raw)

    shadow: ScoringModel | None = None  # a pinned file has no challenger

    def poll(self) -> ScoringModel | None:
        """A newer model to swap in, or None."""
        return None

    def close(self) -> None:
        pass


class RegistryModelSource:
    """The registry's current version; follows promotions announced on pub/sub, and polls
    `current` every `poll_seconds` too, since pub/sub drops messages while disconnected.

    A background thread ("model-loader") reads `current` and `shadow`, and loads a version
    that changed: size first (STRLEN, refused over `max_bytes`), then the bytes, sha256,
    validation and kernel warm-up. A refusal is queued once per change of the key's value
    (a key of the wrong type included) for `poll()` to raise; the running model stays.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        poll_seconds: float = 2.0,
        max_bytes: int = DEFAULT_MAX_MODEL_BYTES,
        raw: bool = False,
    ) -> None:
        self.registry = Registry(client, prefix)
        self.raw = raw  # score with the heads as trained (no calibration)
        self.max_bytes = max_bytes
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._rejected: deque[ModelRejectedError] = deque()  # for poll() to raise, in order
        self._ready: ScoringModel | None = None  # validated, not yet handed over
        self._ready_shadow: object = _UNCHANGED  # a ScoringModel or None, not yet handed over
        self.checks = 0  # registry checks done by the loader thread (tests wait on it)
        self.current, self._seen_current = self._first_model()
        self.shadow: ScoringModel | None = None
        self._seen_shadow: tuple | None = None
        shadow = self._check_shadow()
        if shadow is not _UNCHANGED:
            self.shadow = shadow  # type: ignore[assignment]
        if self.shadow is not None and self.shadow.version == self.current.version:
            self.shadow = None  # started between a promotion's two writes
        self._trouble = False
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._listener = start_listener(client, self.registry.channel, self._wake, self._closed,
                                        "model-updates")  # fmt: skip
        self._loader = threading.Thread(target=self._follow, name="model-loader", daemon=True)
        self._loader.start()

    # ---- the worker's loop ---------------------------------------------------------------

    def poll(self) -> ScoringModel | None:
        """The new current model if `current` moved and it validated, else None; a changed
        shadow is in `self.shadow` after the call. Cheap: the loading happened elsewhere.

        Raises ModelRejectedError once per refusal (per change of `current`).
        """
        with self._lock:
            if self._rejected:
                raise self._rejected.popleft()
            if self._ready_shadow is not _UNCHANGED:
                self.shadow, self._ready_shadow = self._ready_shadow, _UNCHANGED
            ready, self._ready = self._ready, None
            if ready is not None:
                self.current = ready
        return ready

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    # ---- start ---------------------------------------------------------------------------

    def _first_model(self) -> tuple[ScoringModel, tuple]:
        """The current version's model; when it does not load, the last valid one (the
        refusal is queued for poll()). RegistryError when there is none at all."""
        seen, version, error = self._read_current()
        if version is None and error is None:
            raise RegistryError(
                f"no current model in the registry under {self.registry.prefix!r}: "
                "publish one with `intentstream model publish FILE --promote`, or pass --model"
            )
        if version is not None:
            try:
                return self._prepared(version), seen
            except RegistryError as exc:
                error = str(exc)
        refusal = ModelRejectedError(version, error or "")
        fallback = self._last_valid(version)
        if fallback is None:
            raise RegistryError(
                f"{refusal}; no earlier version (model:history, or below it) loads either"
            )
        log.error(
            "current model refused at start; serving the last valid version instead",
            extra={"refused": version, "serving": fallback.version, "error": error},
        )
        self._rejected.append(refusal)
        return fallback, seen

    def _last_valid(self, refused: str | None) -> ScoringModel | None:
        """The newest earlier current version that loads (model:history, newest first),
        else the highest version below the refused one that loads."""
        candidates: list[str] = []
        try:
            candidates += self.registry.history()
        except (RegistryError, redis.ResponseError) as exc:  # NOPERM included
            log.warning("cannot read the model history", extra={"error": str(exc)})
        below = (
            int(refused) - 1
            if refused is not None and refused.isdigit()
            else self.registry.top_version()
        )
        candidates += [str(v) for v in range(below, 0, -1)]
        tried = {refused}
        for version in candidates:
            if version in tried:
                continue
            tried.add(version)
            try:
                return self._prepared(version)
            except NoSuchVersionError:
                continue  # deleted, or never published
            except RegistryError as exc:
                log.warning("earlier model version skipped", extra={"version": version,
                                                                    "error": str(exc)})  # fmt: skip
        return None

    # ---- the loader thread ---------------------------------------------------------------

    def _follow(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.poll_seconds)
            if self._closed.is_set():
                return
            self._wake.clear()
            try:
                # handed over together: a promoted shadow stops shadowing as it takes over
                shadow = self._check_shadow()
                ready = self._check_current()
                with self._lock:
                    if shadow is not _UNCHANGED:
                        self._ready_shadow = shadow
                    if ready is not None:
                        self._ready = ready
                    self._drop_shadow_promoted()
                self._trouble = False
            except redis.RedisError as exc:  # an outage: the next check retries
                self._seen_shadow = None  # a shadow loaded above was not handed over
                if not self._trouble:
                    log.warning("cannot check the model registry: %s", exc,
                                extra={"error": str(exc)})  # fmt: skip
                self._trouble = True
                refresh_topology(self.registry.r)  # cluster: the slots' nodes now
            except Exception:  # never let the thread die: the worker would stop following
                log.exception("model registry check failed")
            self.checks += 1

    def _drop_shadow_promoted(self) -> None:
        """Stop the shadow when its version is the current one. Registry.promote writes
        `current`, then clears `shadow` (two keys, two slots on a cluster): a check between
        the two sees the promoted version as both. Called with the lock held."""
        current = self._ready or self.current
        shadow = self.shadow if self._ready_shadow is _UNCHANGED else self._ready_shadow
        if isinstance(shadow, ScoringModel) and shadow.version == current.version:
            self._ready_shadow = None

    def _read_current(self) -> tuple[tuple, str | None, str | None]:
        """(what `current` holds, for change detection; its version; a RegistryError's
        message when it cannot be read, e.g. a key of the wrong type)."""
        try:
            version = self.registry.current()
        except RegistryError as exc:
            return ("error", str(exc)), None, str(exc)
        return ("version", version), version, None

    def _check_current(self) -> ScoringModel | None:
        """The model of a changed `current`, loaded, or None (unchanged, the running
        model's version, or refused: the refusal is queued)."""
        seen, version, error = self._read_current()
        if seen == self._seen_current:
            return None
        ready = None
        if error is not None:
            self._reject(ModelRejectedError(None, error))
        elif version is not None:
            with self._lock:
                running = self.current.version
                upcoming = self._ready.version if self._ready is not None else running
                if version == running:
                    self._ready = None  # back to the running model before the swap
            if version not in (running, upcoming):
                try:
                    ready = self._prepared(version)
                except RegistryError as exc:
                    self._reject(ModelRejectedError(version, str(exc)))
        self._seen_current = seen  # a redis outage above leaves it unseen: retried
        return ready

    def _reject(self, refusal: ModelRejectedError) -> None:
        with self._lock:
            self._rejected.append(refusal)

    def _check_shadow(self) -> object:
        """The shadow model when the registry's shadow changed (None when there is none; a
        shadow that does not load is logged and skipped: it never stops the worker), else
        _UNCHANGED."""
        try:
            version, error = self.registry.shadow(), None
        except RegistryError as exc:
            version, error = None, str(exc)
        seen = ("error", error) if error is not None else ("version", version)
        if seen == self._seen_shadow:
            return _UNCHANGED
        with self._lock:
            shadow = self.shadow if self._ready_shadow is _UNCHANGED else self._ready_shadow
        new: ScoringModel | None = None
        if error is not None:
            log.error("shadow model refused", extra={"error": error})
        elif shadow is not None and shadow.version == version:  # type: ignore[union-attr]
            new = shadow  # type: ignore[assignment]
        elif version is not None:
            try:
                new = self._prepared(version)
            except RegistryError as exc:
                log.error("shadow model refused", extra={"version": version, "error": str(exc)})
        self._seen_shadow = seen
        return _UNCHANGED if new is shadow else new

    def _prepared(self, version: str) -> ScoringModel:
        """A version's model, size-checked, validated and with its kernels compiled."""
        model = ScoringModel(self.registry.load(version, self.max_bytes), version=version,
                             raw=self.raw)  # fmt: skip
        model.warm_up()
        return model
