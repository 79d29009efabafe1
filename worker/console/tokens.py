"""The console's two tokens (editor, viewer), the signed session cookie and the CSRF token.

Tokens come from `INTENTSTREAM_CONSOLE_TOKEN` / `INTENTSTREAM_CONSOLE_VIEWER_TOKEN`, or from
the file named by the same name with `_FILE` (a mounted secret). Every comparison is
constant-time (hmac.compare_digest). The session cookie holds the role and its expiry,
signed with a key derived from both tokens: rotating a token ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

EDITOR, VIEWER = "editor", "viewer"
ENV = {EDITOR: "INTENTSTREAM_CONSOLE_TOKEN", VIEWER: "INTENTSTREAM_CONSOLE_VIEWER_TOKEN"}
# A token shorter than this is refused: it could be guessed over the network.
MIN_TOKEN_CHARS = 16
SESSION_SECONDS = 12 * 3600


class TokenError(ValueError):
    """No usable token: the message says which variable to set."""


@dataclass(frozen=True)
class Tokens:
    """The editor's and the viewer's token (either may be absent, not both)."""

    editor: str | None
    viewer: str | None

    @property
    def key(self) -> bytes:
        """The signing key of sessions and CSRF tokens, derived from both tokens."""
        material = f"{self.editor or ''}\0{self.viewer or ''}".encode()
        return hmac.new(material, b"intentstream console session", hashlib.sha256).digest()

    def role_of(self, presented: str) -> str | None:
        """The role a presented token grants (None: none); both compared, constant-time."""
        # digests compared, so neither the content nor the length of a token shows in the time
        given = hashlib.sha256(presented.encode()).digest()
        found = None
        for role, token in ((EDITOR, self.editor), (VIEWER, self.viewer)):
            expected = hashlib.sha256((token or "").encode()).digest()
            if hmac.compare_digest(given, expected) and token:
                found = role
        return found

    def fingerprint(self, role: str) -> str:
        """Who, in the audit: the role and 8 hex digits of its token's sha256 (never the
        token), so a rotated token shows as another."""
        token = self.editor if role == EDITOR else self.viewer
        return hashlib.sha256((token or "").encode()).hexdigest()[:8]


def _read(name: str, environ: Mapping[str, str]) -> str | None:
    if environ.get(name):
        return environ[name].strip()
    path = environ.get(f"{name}_FILE")
    if not path:
        return None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise TokenError(f"cannot read {name}_FILE {path}: {exc.strerror}") from None


def load_tokens(environ: Mapping[str, str] | None = None) -> Tokens:
    """The tokens from the environment (or the files it names); TokenError without one."""
    env = os.environ if environ is None else environ
    found = {role: _read(name, env) for role, name in ENV.items()}
    if not any(found.values()):
        raise TokenError(
            f"the console serves nothing without a token: set {ENV[EDITOR]} (may change "
            f"rules and models) and/or {ENV[VIEWER]} (read only), or {ENV[EDITOR]}_FILE"
        )
    for role, token in found.items():
        if token is not None and len(token) < MIN_TOKEN_CHARS:
            raise TokenError(f"{ENV[role]} is shorter than {MIN_TOKEN_CHARS} characters")
    if found[EDITOR] is not None and found[EDITOR] == found[VIEWER]:
        raise TokenError(f"{ENV[EDITOR]} and {ENV[VIEWER]} are the same token")
    return Tokens(found[EDITOR], found[VIEWER])


def _sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def session_cookie(tokens: Tokens, role: str, now: float | None = None) -> str:
    """A session cookie's value: role, expiry, nonce, signature."""
    expires = int((time.time() if now is None else now) + SESSION_SECONDS)
    body = f"{role}.{expires}.{secrets.token_hex(8)}"  # a nonce: each sign-in its own CSRF
    return f"{body}.{_sign(tokens.key, body)}"


def session_role(tokens: Tokens, cookie: str, now: float | None = None) -> str | None:
    """The role of a session cookie, or None when it is forged, altered or expired."""
    body, _, signature = cookie.rpartition(".")
    role, _, rest = body.partition(".")
    expires = rest.partition(".")[0]
    if role not in (EDITOR, VIEWER) or not expires.isdigit():
        return None
    if not hmac.compare_digest(signature.encode(), _sign(tokens.key, body).encode()):
        return None
    return role if int(expires) > (time.time() if now is None else now) else None


def csrf_token(tokens: Tokens, cookie: str) -> str:
    """The CSRF token of a session: bound to its cookie, so another session's is refused."""
    return _sign(tokens.key, f"csrf.{cookie}")


def csrf_ok(tokens: Tokens, cookie: str, presented: str) -> bool:
    """Whether a presented CSRF token is the session's (constant-time)."""
    return hmac.compare_digest(presented.encode(), csrf_token(tokens, cookie).encode())
