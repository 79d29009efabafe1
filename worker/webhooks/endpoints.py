"""An endpoint: where one shop's receiver takes the actions, with its secret, the rules it
wants and its timeout. Validated by pydantic; kept as JSON in the `{prefix}:webhooks` hash."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worker.webhooks.signing import masked, secret_key

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class Endpoint(BaseModel):
    """One webhook endpoint as stored."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: str
    url: str
    secret: str = Field(repr=False)
    rules: tuple[str, ...] = ()  # empty: every rule's actions
    timeout: float = Field(10.0, gt=0, le=300)
    start: str = "0-0"  # the actions' entry id the endpoint's groups start after

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.fullmatch(v):
            raise ValueError("an endpoint's name is 1-64 letters, digits, _ . -")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the URL must be http:// or https:// with a host")
        return v

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: str) -> str:
        secret_key(v)  # SecretError is a ValueError: pydantic reports it without the value
        return v

    @property
    def key(self) -> bytes:
        return secret_key(self.secret)

    @property
    def group(self) -> str:
        """The endpoint's consumer group on every actions stream."""
        return f"webhook:{self.name}"

    def wants(self, rule: str) -> bool:
        return not self.rules or rule in self.rules

    def shown(self) -> dict[str, object]:
        """What `webhooks list` prints: the URL without its password, the secret masked."""
        return {
            "name": self.name,
            "url": shown_url(self.url),
            "secret": masked(self.secret),
            "rules": list(self.rules),
            "timeout": self.timeout,
            "start": self.start,
        }


def shown_url(url: str) -> str:
    """A URL fit for a terminal or a log: a password in it replaced by ***, query dropped
    (tokens live there too)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    query = "..." if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query))
