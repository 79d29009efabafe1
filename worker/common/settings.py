"""Worker settings (docs/contract.md, Settings): environment variables `INTENTSTREAM_*`,
overridden by flags.

Each field is one setting; `add_setting_flags` turns the fields into `--flags`, so the
documentation, the environment and the command line cannot drift apart.
"""

from __future__ import annotations

import argparse
import difflib
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.common.dedup import DEFAULT_WINDOW, DEFAULT_WINDOW_SECONDS, MAX_WINDOW, ResendWindow
from worker.common.events import DEFAULT_MAX_TS_SKEW_MS

# Entries per read and so per commit at most. 1024 rather than 512: at the same traffic the
# p99 was the same or lower (Xeon, 52k events/s 7-8 ms against 8-13; 80k 13-15 against
# 19-32) and the capacity ~15% higher, a batch's fixed cost spread over twice the events;
# each commit's EXEC holds Redis up to twice as long (~2.5 ms at 1024). BENCHMARKS.md.
DEFAULT_BATCH_SIZE = 1024


def default_consumer() -> str:
    """Consumer name unique per process: host name and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Everything the worker can be told; see docs/contract.md, Settings."""

    model_config = SettingsConfigDict(env_prefix="INTENTSTREAM_", extra="forbid")  # ENV_PREFIX

    redis_url: str = Field(
        "redis://localhost:6379/0",
        description="redis://host:port/db, rediss:// (TLS) or unix:///path.sock?db=0; "
        "user:password@ for ACL users",
    )
    cluster: bool = Field(
        False, description="the URL names a node of a Redis Cluster (use the cluster client)"
    )
    prefix: str = Field("intentstream", description="key prefix of every stream and key")
    partitions: int = Field(1, ge=1, le=4096, description="number of event stream partitions")
    group: str = Field("intentstream-workers", description="consumer group name")
    consumer: str = Field(default_factory=default_consumer, description="consumer name")
    model: Path | None = Field(
        None, description="model artifact file (pins it); default: the registry's current"
    )
    model_poll_seconds: float = Field(
        2.0, gt=0, description="how often to check the registry's current model"
    )
    max_model_bytes: int = Field(
        64 * 2**20,
        ge=1,
        description="refuse registry model artifacts larger than this, in bytes (measured "
        "with STRLEN before they are read)",
    )
    raw_scores: bool = Field(
        False,
        description="score with the model's head as trained, without the calibration its "
        "artifact records (scores are then not probabilities)",
    )
    batch_size: int = Field(
        DEFAULT_BATCH_SIZE, ge=1, le=100_000, description="max entries per read"
    )
    block_ms: int = Field(1000, ge=1, description="blocking read time in ms")
    socket_timeout: float = Field(5.0, gt=0, description="Redis socket timeout in seconds")
    wait_for_redis: float = Field(
        300.0,
        ge=0,
        description="at start, wait this many seconds for a Redis that cannot be reached, "
        "then exit 2; 0 = try once (a Redis lost later is waited for without end)",
    )
    lease_ms: int = Field(
        10_000, ge=100, description="partition lease; a dead worker's partitions move after it"
    )
    scores_maxlen: int = Field(
        1_000_000, ge=1, description="approximate length the score streams are trimmed to"
    )
    state_cache_users: int = Field(
        200_000, ge=0, description="user states kept in memory between batches; 0 = off"
    )
    state_ttl_seconds: int = Field(0, ge=0, description="expire idle user states; 0 = never")
    layout: Literal["full", "lean"] = Field(
        "full",
        description="how states and score entries are stored: full (every state value a "
        "field, score entries with type and ts) or lean (a state's values packed in one "
        "field `s` beside score and model; score entries of user_id, score, event_id and "
        "model): about a third less Redis CPU per commit (docs/contract.md, The lean layout)",
    )
    retention_seconds: int = Field(
        7 * 24 * 3600, ge=0, description="keep this much event history (MINID); 0 = no trim"
    )
    history_events: int = Field(
        32,
        ge=0,
        le=1000,
        description="recent events of a user's session kept with the state, replayed to "
        "rebuild it under a new model; 0 = off",
    )
    event_id_window: int = Field(
        DEFAULT_WINDOW,
        ge=1,
        le=MAX_WINDOW,
        description="the most producer event_ids remembered per user within the resend window "
        "(more are forgotten early and counted; events stamped by publish() need none: "
        "docs/producers.md, Retries and deduplication)",
    )
    resend_window_seconds: int = Field(
        DEFAULT_WINDOW_SECONDS,
        ge=1,
        le=366 * 24 * 3600,
        description="a producer event_id applied this many seconds before (by entry id "
        "times) or less is a resend when it comes again",
    )
    max_ts_skew_ms: int = Field(
        DEFAULT_MAX_TS_SKEW_MS,
        ge=0,
        description="dead-letter an event whose ts is more than this many ms ahead of its "
        "entry id's time (docs/producers.md, Timestamps)",
    )
    retention_max_entries: int = Field(
        1_000_000,
        ge=0,
        description="keep at most about this many entries of history per partition stream "
        "(never trims unacknowledged ones); 0 = no cap",
    )
    deadletter_maxlen: int = Field(
        10_000, ge=1, description="approximate length the dead-letter streams are trimmed to"
    )
    deadletter_max_value_bytes: int = Field(
        512, ge=16, description="cut each stored dead-letter field to this many bytes"
    )
    metrics_host: str = Field("127.0.0.1", description="address the metrics server binds")
    metrics_port: int = Field(9108, ge=0, le=65535, description="metrics port; 0 = off")
    log_format: Literal["json", "text", "auto"] = Field(
        "auto", description="json, text, or auto (json when stderr is not a terminal)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="log level: DEBUG, INFO, WARNING or ERROR"
    )

    def resend_window(self) -> ResendWindow:
        """The resend memory's window: its time and its bound."""
        return ResendWindow(self.resend_window_seconds, self.event_id_window)

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(
                f"must start with redis://, rediss:// or unix://, got {parts.scheme!r}"
            )
        try:
            parts.port  # noqa: B018 (urllib checks the port when it is read)
        except ValueError:  # the URL itself is not shown: it may hold a password
            port = parts.netloc.rsplit("@", 1)[-1].rsplit(":", 1)[-1]
            raise ValueError(f"the URL's port must be a number 0-65535, got {port!r}") from None
        return v

    @field_validator("prefix", "group", "consumer")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not v or any(c in v for c in "{} \t\r\n"):
            raise ValueError("must be non-empty, without braces or whitespace")
        return v

    @model_validator(mode="after")
    def _block_below_socket_timeout(self) -> Settings:
        # A read that blocks longer than the socket timeout would time out client-side.
        if self.block_ms >= self.socket_timeout * 1000 * 0.8:
            raise ValueError(
                f"--block-ms ({self.block_ms}) must stay below 80% of --socket-timeout "
                f"({self.socket_timeout:g} s)"
            )
        return self


class DeliverySettings(Settings):
    """`intentstream deliver`'s settings: the worker's connection, logging and metrics
    settings and the webhook delivery's own (docs/webhooks.md)."""

    metrics_port: int = Field(9109, ge=0, le=65535, description="metrics port; 0 = off")
    webhook_retry_cap_seconds: float = Field(
        300.0, gt=0, description="longest wait between two attempts of one delivery"
    )
    webhook_max_age_seconds: float = Field(
        86400.0,
        gt=0,
        description="an action still undelivered this long after its commit is dead-lettered",
    )
    webhook_senders: int = Field(
        2, ge=1, le=256, description="senders per endpoint (consumers of its group, threads)"
    )
    webhook_connections: int = Field(
        32,
        ge=1,
        le=1024,
        description="keep-alive connections per endpoint: the POSTs it has in flight at most",
    )
    webhook_max_held: int = Field(
        1000,
        ge=1,
        description="deliveries a sender keeps waiting for a retry before it "
        "stops reading new actions",
    )
    webhook_claim_idle_seconds: float = Field(
        60.0,
        gt=0,
        description="take over a delivery another deliverer left unattended this long "
        "(a process that died)",
    )
    webhook_poll_seconds: float = Field(
        2.0, gt=0, description="how often to re-read the endpoints (webhooks add|remove)"
    )
    webhook_measure_seconds: float = Field(
        5.0,
        gt=0,
        description="how often to measure each endpoint's oldest undelivered action and "
        "count the actions trimmed before it read them",
    )


class SettingsError(ValueError):
    """Invalid configuration; the message names the setting, its flag and its variable."""


def add_setting_flags(
    parser: argparse.ArgumentParser,
    names: list[str] | None = None,
    settings: type[Settings] = Settings,
) -> None:
    """Add a `--flag` per setting of `settings` (all, or `names`); unset flags stay None."""
    for name, field in settings.model_fields.items():
        if names is not None and name not in names:
            continue
        env = f"INTENTSTREAM_{name.upper()}"
        flag = "--" + name.replace("_", "-")
        default = "host name and pid" if field.default_factory else field.default
        shown = (
            "none" if default is None else f"{default:g}" if isinstance(default, float) else default
        )
        help = (
            f"{field.description or name} (env {env}"
            + ("" if "default:" in (field.description or "") else f"; default: {shown}")
            + ")"
        ).replace("%", "%%")
        if field.annotation is bool:  # a switch: --cluster, not --cluster true
            parser.add_argument(flag, dest=name, action="store_const", const=True, help=help)
        else:
            # unset flags stay None: the environment's value stays in force
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=help)


def load_settings(
    args: argparse.Namespace | None = None, settings: type[Settings] = Settings, **overrides: object
) -> Settings:
    """Settings (or `settings`, a subclass) from the environment, overridden by flags that
    were given."""
    flags = vars(args) if args is not None else {}
    given = {k: v for k, v in flags.items() if k in settings.model_fields and v is not None}
    given.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return settings(**given)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            name = ".".join(str(p) for p in e["loc"])
            if name in given:  # as every command names a bad value: by its flag
                where = "--" + name.replace("_", "-")
            elif name in settings.model_fields:  # from the environment
                where = f"{ENV_PREFIX}{name.upper()}"
            else:  # a check of several settings: its message names them
                problems.append(e["msg"].removeprefix("Value error, "))
                continue
            problems.append(f"{where}: {setting_problem(e)}")
        raise SettingsError("; ".join(problems)) from None


_LIMITS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
           "less_than": "<"}  # fmt: skip
_PARSING = {
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "bool_parsing": "expected true or false",
}


def setting_problem(error: Mapping) -> str:
    """A pydantic error of one setting in the words of the commands' other checks
    (worker/commands/args.py): `must be >= 1, got 0`, `expected an integer, got 'lots'`."""
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind in _LIMITS:
        (limit,) = ctx.values()
        shown = f"{limit:g}" if isinstance(limit, float) else str(limit)
        return f"must be {_LIMITS[kind]} {shown}, got {value}"
    if kind in _PARSING:
        return f"{_PARSING[kind]}, got {value!r}"
    msg = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    return msg if "got " in msg else f"{msg}, got {value!r}"


ENV_PREFIX = "INTENTSTREAM_"
# Read by the console script itself, not settings.
NOT_SETTINGS = frozenset({"INTENTSTREAM_TRACEBACK"}) | frozenset(
    f"INTENTSTREAM_CONSOLE_{role}TOKEN{file}"  # the console's tokens (worker/console/tokens.py)
    for role in ("", "VIEWER_")
    for file in ("", "_FILE")
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each INTENTSTREAM_* variable that names no setting, with the closest
    name: pydantic ignores such a typo silently (INTENTSTREAM_BATCHSIZE)."""
    fields = {*Settings.model_fields, *DeliverySettings.model_fields}
    known = {ENV_PREFIX + name.upper() for name in fields} | NOT_SETTINGS
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
    warnings = []
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known):
        # compared without the shared prefix, which would make any two names look alike
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1)
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        warnings.append(f"{name} is not a setting and is ignored{hint}")
    return warnings
