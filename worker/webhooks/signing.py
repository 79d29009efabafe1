"""Standard Webhooks signatures: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` under
a `whsec_`-prefixed base64 secret (docs/webhooks.md, Verifying a delivery)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
# The specification asks for 24 to 64 random bytes; shorter keys are refused, longer ones kept.
MIN_SECRET_BYTES, MAX_SECRET_BYTES = 24, 128


class SecretError(ValueError):
    """A secret that is not `whsec_` followed by base64 of 24-128 bytes; never quotes it."""


def secret_key(secret: str) -> bytes:
    """The HMAC key a `whsec_...` secret encodes."""
    if not secret.startswith(SECRET_PREFIX):
        raise SecretError(f"a secret starts with {SECRET_PREFIX} (then base64)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"a secret is {SECRET_PREFIX} followed by base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise SecretError(
            f"a secret's key is {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, this one {len(key)}"
        )
    return key


def new_secret() -> str:
    """A fresh secret: 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def masked(secret: str) -> str:
    """What may be shown of a secret: its prefix and last four characters."""
    return f"{SECRET_PREFIX}...{secret[-4:]}" if len(secret) > len(SECRET_PREFIX) + 8 else "***"


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value of one attempt."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt, with the JSON content type."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
    }
