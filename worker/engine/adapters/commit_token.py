"""A partition's last commit token: who committed, and up to which entry. Each commit writes
it beside the partition's position (adapters/commit.py); readers recover the position from it
when the position key is gone (adapters/streams.py, `partitions repair`)."""

from __future__ import annotations

from worker.common.entry_ids import valid_id
from worker.engine.compute.pipeline import Commit


def token_of(holder: str, commit: Commit) -> bytes:
    """What the commit records as the partition's last commit: who, and up to which entry."""
    return holder.encode() + b" " + commit.ack_ids[-1]


def token_position(token: object) -> bytes | None:
    """The entry id a last-commit token (`token_of`) records, or None (absent, malformed)."""
    if not isinstance(token, bytes):
        return None
    _, sep, last = token.rpartition(b" ")
    return last if sep and valid_id(last) else None


def position_of(acked: object, token: object) -> bytes | None:
    """The partition's position: its `acked`, else (deleted) the entry its last commit token
    records, else the stream's start `0-0`; None when `acked` is not an entry id."""
    if acked is None:
        return token_position(token) or b"0-0"
    return acked if isinstance(acked, bytes) and valid_id(acked) else None
