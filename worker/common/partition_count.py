"""The partition count in force, recorded in Redis (`{prefix}:config`, field `partitions`).

Users are spread over partitions by crc32(user_id) mod P. A worker or producer with another P
would put a user's events on another stream and split their state, so every process that
reads or writes the streams checks the recorded count at start and refuses another one;
the first worker records it (producers only read it: a producer credential must not be able
to write what stops the workers).
"""

from __future__ import annotations

import redis

from worker.common.connection import Client, name_wrong_type
from worker.common.keys import Keys
from worker.common.settings import SettingsError


class PartitionCountError(SettingsError):
    """This process's partition count is not the one in force; the message says both."""


class ResizeUnfinishedError(PartitionCountError):
    """`intentstream partitions resize` has begun and not finished (a producer waits it out)."""


def recorded_partitions(client: Client, keys: Keys) -> int | None:
    """The partition count recorded under the prefix, or None before the first process."""
    try:
        raw = client.hget(keys.config, "partitions")
    except redis.ResponseError as exc:
        name_wrong_type(client, exc, {keys.config: "hash"})
        raise
    return int(raw) if raw is not None else None


def check_partitions(client: Client, keys: Keys, partitions: int, record: bool = True) -> None:
    """Record `partitions` if nothing is recorded yet (unless `record` is False: a producer
    then goes on unchecked); refuse another count, or any count while `intentstream
    partitions resize` is unfinished."""
    try:
        if record:
            client.hsetnx(keys.config, "partitions", partitions)
        config = client.hgetall(keys.config)
    except redis.ResponseError as exc:
        name_wrong_type(client, exc, {keys.config: "hash"})
        raise
    if b"partitions" not in config:
        return  # only a producer gets here: the first worker records its count
    recorded = int(config[b"partitions"])
    if b"resize_to" in config:
        raise ResizeUnfinishedError(
            f"a change of the partition count from {recorded} to "
            f"{int(config[b'resize_to'])} is unfinished under prefix {keys.prefix!r}: run "
            "`intentstream partitions resize` again to finish it"
        )
    if recorded != partitions:
        raise PartitionCountError(
            f"the streams under prefix {keys.prefix!r} have {recorded} partitions "
            f"({keys.config}), this process was started with {partitions}: use "
            f"--partitions {recorded}, or `intentstream partitions resize --to {partitions}`"
        )
