"""The model registry in Redis (SPEC §5): versioned artifacts, a current pointer, rollback.

Keys (named in worker/keys.py): `model:seq` (INCR gives versions), `model:<v>` (artifact
bytes), `model:meta:<v>` (JSON: the artifact's meta plus sha256, size, publication time),
`model:current` (version string), `model:history` (a list of earlier currents, for rollback),
and announcements on the pub/sub channel `model:updates`. Every artifact read back is checked
against its recorded sha256 and validated before use.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis

from model.artifact import ArtifactError, Model, model_from_bytes, model_to_bytes, sha256_hex
from worker.keys import Keys


class RegistryError(Exception):
    """A registry operation that cannot be done; the message says why."""


class Registry:
    """Versioned models stored in Redis under one prefix."""

    def __init__(self, client: redis.Redis, prefix: str = "intentstream") -> None:
        self.r = client
        self.prefix = prefix
        self.keys = Keys(prefix)

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

    def meta(self, version: str) -> dict:
        """The stored meta of a version."""
        raw = self.r.get(self.keys.model_meta(version))
        if raw is None:
            raise RegistryError(f"no model version {version!r} in the registry")
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RegistryError(f"meta of version {version} is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise RegistryError(f"meta of version {version} is not a JSON object")
        return doc

    def artifact_bytes(self, version: str) -> bytes:
        """The artifact bytes of a version, checked against the recorded sha256."""
        data = self.r.get(self.keys.model_artifact(version))
        if data is None:
            raise RegistryError(f"no model version {version!r} in the registry")
        expected = self.meta(version).get("sha256")
        if expected != sha256_hex(data):
            raise RegistryError(f"version {version} is corrupt: its sha256 does not match its meta")
        return data

    def load(self, version: str) -> Model:
        """A validated Model of a version; RegistryError names what is wrong."""
        try:
            return model_from_bytes(self.artifact_bytes(version))
        except ArtifactError as exc:
            raise RegistryError(f"version {version} does not load: {exc}") from None

    def current(self) -> str | None:
        """The current version, or None when nothing was promoted."""
        raw = self.r.get(self.keys.model_current)
        return raw.decode() if raw is not None else None

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
        raw = self.r.get(self.keys.model_shadow)
        return raw.decode() if raw is not None else None

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
