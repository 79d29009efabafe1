"""What the console script tells a user about a failure: one line naming what to fix.

`main()` runs every sub-command through `explain`, so a new sub-command gets one-line errors
for the known kinds of failure without code of its own. Anything else is a bug and keeps its
traceback. `INTENTSTREAM_TRACEBACK=1` shows the traceback of the known kinds too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from worker.common.logs import JsonFormatter

if TYPE_CHECKING:
    import redis
    from pydantic import ValidationError

# `say` is light: a command refusing a flag or a setting says so before numpy, Numba or redis
# are imported; `explain`, which knows every failure's type, imports them when it runs.

# Exit code of a user error or an unreachable service (argparse's usage errors use it too).
USAGE_EXIT = 2

# Config fields whose flag is not simply `--field-name`.
FIELD_FLAGS = {"session_gap_seconds": "--session-gap"}


def say(level: str, line: str, args: argparse.Namespace | None = None) -> None:
    """Print an error or warning of the command line: one JSON log line when JSON logs were
    asked for (`--log-format json` / INTENTSTREAM_LOG_FORMAT=json), as the worker's other
    lines, else `level: line`."""
    fmt = getattr(args, "log_format", None) or os.environ.get("INTENTSTREAM_LOG_FORMAT")
    if fmt == "json":
        record = logging.makeLogRecord(
            {"name": "intentstream", "levelname": level.upper(), "msg": line}
        )
        print(JsonFormatter().format(record), file=sys.stderr)
    else:
        print(f"{level}: {line}", file=sys.stderr)


def redacted(url: str) -> str:
    """The URL with its password replaced by ***, fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _redis_url(args: argparse.Namespace) -> str | None:
    """The Redis URL the command used, redacted; None for the private redis-server a command
    started itself (the benchmarks; the demo without --redis-url), which no setting names."""
    from worker.common.settings import Settings

    url = getattr(args, "redis_url", None)
    if url is None and getattr(args, "private_redis", False):
        return None
    url = url or os.environ.get("INTENTSTREAM_REDIS_URL")
    return redacted(url or Settings.model_fields["redis_url"].default)


def flag_of(field: str, parser: argparse.ArgumentParser | None) -> str:
    """The command-line flag that sets a config field, or the field's name when none does."""
    if field in FIELD_FLAGS:
        return FIELD_FLAGS[field]
    for action in parser._actions if parser else []:
        if action.dest == field and action.option_strings:
            return action.option_strings[0]
    return field


def validation_line(exc: ValidationError, parser: argparse.ArgumentParser | None) -> str:
    """A pydantic error as one line: each bad field by its flag, the problem, the value given."""
    problems = []
    for e in exc.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        msg = e["msg"].removeprefix("Value error, ")
        given = f" (got {e['input']!r})" if field and not isinstance(e["input"], dict) else ""
        problems.append(f"{flag_of(field, parser) if field else 'input'}: {msg}{given}")
    return "; ".join(problems)


def acl_refusal(exc: BaseException) -> redis.exceptions.NoPermissionError | None:
    """The ACL refusal (NOPERM) behind a failure, if any. redis-py's cluster client turns a
    refused CLUSTER SLOTS into "Cluster mode is not enabled on this node" (and that into
    "cannot be connected"), keeping the NOPERM reply only as the exceptions' cause."""
    import redis

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, redis.exceptions.NoPermissionError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def not_a_cluster(exc: BaseException) -> bool:
    """The cluster client (--cluster) met a server that is no cluster node: a setting to fix,
    not an outage to wait out (an ACL refusal of CLUSTER SLOTS reads alike: acl_refusal)."""
    from redis.exceptions import RedisClusterException

    return (
        isinstance(exc, RedisClusterException)
        and "Cluster mode is not enabled" in str(exc)
        and acl_refusal(exc) is None
    )


def _data_error() -> tuple[type, ...]:
    """Training's DataError, when its module is loaded: it imports Numba, and an error of its
    class was raised only if it was (a Redis error of `model list` loads no kernels)."""
    sessions = sys.modules.get("model.training.sessions")
    return (sessions.DataError,) if sessions is not None else ()


def explain(exc: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a failure the user can fix, or None for a bug (keep the traceback)."""
    import redis
    from pydantic import ValidationError
    from redis.exceptions import RedisClusterException  # not a RedisError: no cluster reachable

    from model.artifact import ArtifactError
    from worker.common.events import EventError
    from worker.common.settings import SettingsError
    from worker.lifecycle.registry import RegistryError

    parser = getattr(args, "_parser", None)
    url = _redis_url(args)
    # a command's own redis-server is named as such: the default URL would point at a Redis
    # it never touched
    where = f"Redis at {url}" if url is not None else "the private Redis this command started"
    refusal = acl_refusal(exc)
    if refusal is not None:
        user = urlsplit(url).username if url is not None else None
        return (
            f"{where} refused a command: the ACL user {user or 'default'!r} lacks a permission "
            f"({refusal}; see deploy/redis/users.acl)"
        )
    if not_a_cluster(exc):
        return (
            f"{where} is not a Redis Cluster node (cluster mode is not enabled there): "
            "drop --cluster / INTENTSTREAM_CLUSTER, or name a cluster node"
        )
    if isinstance(exc, redis.AuthenticationError):
        return f"{where} refused the login: {exc} (user:password@ in --redis-url)"
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, RedisClusterException)):
        hint = " (--redis-url / INTENTSTREAM_REDIS_URL)" if url is not None else ""
        return f"{where} is unreachable: {exc}{hint}"
    if isinstance(exc, redis.RedisError):
        return f"{where} replied: {exc}"
    if isinstance(exc, OSError):  # a file not found, not readable, a directory, a port taken
        return f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc)
    if isinstance(exc, ValidationError):
        return validation_line(exc, parser)
    if isinstance(exc, (SettingsError, ArtifactError, RegistryError, EventError, *_data_error())):
        return str(exc)
    if isinstance(exc, ValueError):  # raised on a value the user gave
        return str(exc)
    return None
