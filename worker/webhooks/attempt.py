"""How one POST to an endpoint ended: its HTTP status, or the error that stopped it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: the HTTP status, or the error that stopped it."""

    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def result(self) -> str:
        """Its metric label: 2xx, 3xx, 4xx, 5xx, timeout, connection or error."""
        if self.status is not None:
            return f"{min(max(self.status // 100, 1), 5)}xx"
        return self.error.split(":", 1)[0] if self.error else "error"

    def describe(self) -> str:
        return f"HTTP {self.status}" if self.status is not None else str(self.error)


TIMED_OUT = Attempt(None, "timeout: no reply within the endpoint's timeout")
NOT_CONNECTED = Attempt(None, "timeout: no connection within the endpoint's timeout")
