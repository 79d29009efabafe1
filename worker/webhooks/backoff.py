"""When a failed delivery is tried again: 1 s, 2 s, 4 s, ... capped, with jitter, until the
maximum age after the action's commit."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Jitter from a generator of its own: the global one's state is a test's or another
# library's, which a delivery thread drawing from it would disturb
_JITTER = random.Random()


@dataclass(frozen=True)
class RetrySchedule:
    """Doubling waits from `first` up to `cap` seconds; given up `max_age` seconds after the
    commit. `jitter` takes up to that share off each wait, so a failed burst spreads out."""

    first: float = 1.0
    cap: float = 300.0
    max_age: float = 86400.0
    jitter: float = 0.2

    def wait(self, failures: int, rand: float | None = None) -> float:
        """Seconds before the next attempt after `failures` (>= 1) failed ones; `rand` in
        [0, 1) (default: random)."""
        base = min(self.cap, self.first * 2.0 ** min(failures - 1, 62))
        r = _JITTER.random() if rand is None else rand
        return base * (1.0 - self.jitter * r)

    def expired(self, age_seconds: float) -> bool:
        """Whether a delivery this old (since the commit) is given up."""
        return age_seconds >= self.max_age
