"""The model registry in Redis (docs/contract.md, Model artifacts and the registry):
versioned artifacts, a current pointer, rollback.

Keys (named in worker/common/keys.py): `model:seq` (INCR gives versions), `model:<v>` (artifact
bytes), `model:meta:<v>` (JSON: the artifact's meta plus sha256, size, publication time),
`model:current` (version string), `model:history` (a list of earlier currents, for rollback),
and announcements on the pub/sub channel `model:updates`. Every artifact read back is checked
against its recorded sha256 and validated before use. A key of the wrong type (a hash where
a version string or artifact should be) raises RegistryError naming the key and its type.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis

from model.artifact import ArtifactError, Model, model_from_bytes, model_to_bytes, sha256_hex
from worker.common.keys import Keys

T = TypeVar("T")
log = logging.getLogger("intentstream.models")


class RegistryError(Exception):
    """A registry operation that cannot be done; the message says why."""


class NoSuchVersionError(RegistryError):
    """The version has no artifact or no meta in the registry."""


def mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.1f} MiB)"


class Registry:
    """Versioned models stored in Redis under one prefix."""

    def __init__(self, client: redis.Redis, prefix: str = "intentstream") -> None:
        self.r = client
        self.prefix = prefix
        self.keys = Keys(prefix)
        self._strlen_allowed = True

    @property
    def channel(self) -> str:
        """The pub/sub channel announcing promotions."""
        return self.keys.model_updates

    def publish(self, data: bytes, promote: bool = False) -> str:
        """Store validated artifact bytes as a new version; return the version."""
        model = model_from_bytes(data)  # refuse anything that would not load
        version = str(self.r.incr(self.keys.model_seq))
        meta = model.meta.model_dump() | {
            "version": version,
            "sha256": sha256_hex(data),
            "size": len(data),
            "published_at": time.time(),
        }
        # The meta is written last: a version is listed once its meta exists, so a crash in
        # between leaves an unlisted artifact, never a listed version without bytes. (No
        # MULTI: on a Redis Cluster these keys live in different slots.)
        self.r.set(self.keys.model_artifact(version), data)
        self.r.set(self.keys.model_meta(version), json.dumps(meta))
        if promote:
            self.promote(version)
        return version

    def publish_model(self, model: Model, promote: bool = False) -> str:
        """Store a Model as a new version."""
        return self.publish(model_to_bytes(model), promote)

    def versions(self) -> list[str]:
        """Every stored version, oldest first."""
        top = int(self.r.get(self.keys.model_seq) or 0)
        if not top:
            return []
        pipe = self.r.pipeline(transaction=False)
        for v in range(1, top + 1):
            pipe.exists(self.keys.model_meta(str(v)))
        return [str(v) for v, there in zip(range(1, top + 1), pipe.execute(), strict=True) if there]

    def _read(self, key: str, command: Callable[[str], T]) -> T:
        """command(key), with a key of the wrong type named in a RegistryError."""
        try:
            return command(key)
        except redis.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            try:
                kind = self.r.type(key)
                kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            except redis.RedisError:
                kind = "another type"
            raise RegistryError(
                f"registry key {key} holds a {kind}, not a string (WRONGTYPE)"
            ) from None

    def meta(self, version: str) -> dict:
        """The stored meta of a version."""
        raw = self._read(self.keys.model_meta(version), self.r.get)
        if raw is None:
            raise NoSuchVersionError(f"no model version {version!r} in the registry")
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RegistryError(f"meta of version {version} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise RegistryError(f"meta of version {version} is not a JSON object")
        return doc

    def artifact_size(self, version: str) -> int | None:
        """The artifact's length in bytes (STRLEN; 0 when absent). A Redis user that may
        not run STRLEN gets the size recorded in the meta (None without one); it is asked
        once per Registry, so its ACL log shows one denial, not one per load."""
        if self._strlen_allowed:
            key = self.keys.model_artifact(version)
            try:
                return int(self._read(key, self.r.strlen))
            except redis.exceptions.NoPermissionError as exc:
                self._strlen_allowed = False
                log.warning(
                    "this Redis user may not run STRLEN: model sizes are checked against "
                    "the size their meta records, and once read (grant it +strlen)",
                    extra={"error": str(exc)},
                )
        size = self.meta(version).get("size")
        return size if isinstance(size, int) else None

    def check_size(self, version: str, max_bytes: int) -> None:
        """Refuse a version whose artifact is over max_bytes, before reading it."""
        size = self.artifact_size(version)
        if size is not None and size > max_bytes:
            raise RegistryError(too_large(version, size, max_bytes))

    def artifact_bytes(self, version: str, max_bytes: int | None = None) -> bytes:
        """The artifact bytes of a version, checked against the recorded sha256; with
        max_bytes, a larger artifact is refused by its length before it is read."""
        if max_bytes is not None:
            self.check_size(version, max_bytes)
        data = self._read(self.keys.model_artifact(version), self.r.get)
        if data is None:
            raise NoSuchVersionError(f"no model version {version!r} in the registry")
        if max_bytes is not None and len(data) > max_bytes:  # grew since it was measured
            raise RegistryError(too_large(version, len(data), max_bytes))
        expected = self.meta(version).get("sha256")
        if expected != sha256_hex(data):
            raise RegistryError(f"version {version} is corrupt: its sha256 does not match its meta")
        return data

    def load(self, version: str, max_bytes: int | None = None) -> Model:
        """A validated Model of a version; RegistryError names what is wrong."""
        try:
            return model_from_bytes(self.artifact_bytes(version, max_bytes))
        except ArtifactError as exc:
            raise RegistryError(f"version {version} does not load: {exc}") from None

    def current(self) -> str | None:
        """The current version, or None when nothing was promoted."""
        raw = self._read(self.keys.model_current, self.r.get)
        return raw.decode(errors="replace") if raw is not None else None

    def history(self) -> list[str]:
        """The earlier current versions, newest first (LRANGE)."""
        raw = self._read(self.keys.model_history, lambda key: self.r.lrange(key, 0, -1))
        return [v.decode(errors="replace") for v in reversed(raw)]

    def top_version(self) -> int:
        """The highest version ever given out (model:seq), 0 when none or unreadable."""
        raw = self._read(self.keys.model_seq, self.r.get)
        try:
            return int(raw or 0)
        except ValueError:
            return 0

    def promote(self, version: str) -> None:
        """Make a version current (after checking it loads) and announce it."""
        self.load(version)
        previous = self.current()
        if previous is not None and previous != version:
            self.r.rpush(self.keys.model_history, previous)
        self.r.set(self.keys.model_current, version)
        if self.shadow() == version:  # the challenger won: its states are current now
            self.r.delete(self.keys.model_shadow)
        self.r.publish(self.channel, version)

    def shadow(self) -> str | None:
        """The shadow version (scored beside the current one by every worker), or None."""
        raw = self._read(self.keys.model_shadow, self.r.get)
        return raw.decode(errors="replace") if raw is not None else None

    def set_shadow(self, version: str | None) -> None:
        """Make a version the shadow (after checking it loads), or stop shadowing (None)."""
        if version is None:
            self.r.delete(self.keys.model_shadow)
        else:
            self.load(version)
            self.r.set(self.keys.model_shadow, version)
        self.r.publish(self.channel, f"shadow {version or ''}".strip())

    def rollback(self) -> str:
        """Make the previous current version current again; return it."""
        while True:
            previous = self.r.rpop(self.keys.model_history)
            if previous is None:
                raise RegistryError("nothing to roll back to: no earlier current version")
            version = previous.decode()
            # skip versions deleted since, and the current one (a promotion that stopped
            # between its two writes pushed it)
            if version != self.current() and self.r.exists(self.keys.model_meta(version)):
                break
        self.r.set(self.keys.model_current, version)
        self.r.publish(self.channel, version)
        return version

    def export(self, version: str, path: str | Path) -> None:
        """Write a version's artifact to a file."""
        Path(path).write_bytes(self.artifact_bytes(version))


def too_large(version: str, size: int, max_bytes: int) -> str:
    return (
        f"version {version} is {mib(size)}, over the limit of {mib(max_bytes)} "
        "(--max-model-bytes / INTENTSTREAM_MAX_MODEL_BYTES)"
    )
