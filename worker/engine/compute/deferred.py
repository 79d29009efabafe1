"""Dataclass instances made with the few fields their first readers need, the rest made on
first use of any of them.

At low traffic a node's round splits a group's Commit and states into one per batch
(compute/joint.py, UserStates.view). Before its transaction goes, a batch's share is read
for its partition, sequence, entries, users and parts only, yet slicing every array of it
cost a few µs a batch, a large part of what a round of eight partitions pays over one. Deferred,
the rest is sliced when the settling reads it, or never (a view of the states whose commit
only counts its resets). Equality, repr and copies read every field, so they see all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the name under which an instance keeps what makes the rest of its fields
_REST = "_deferred_rest"


class Deferred:
    """Mixin for a dataclass: `made` gives an instance with some fields set and a function
    that returns the others; reading one of those calls it once."""

    @classmethod
    def made(cls, head: dict[str, Any], rest: Callable[[], dict[str, Any]]) -> Any:
        """An instance with the fields `head`, the others from `rest()` on first use."""
        instance = object.__new__(cls)
        vars(instance).update(head)
        vars(instance)[_REST] = rest
        return instance

    @property
    def deferring(self) -> bool:
        """Whether some of its fields are still to be made."""
        return _REST in vars(self)

    def fill(self) -> None:
        """Make the deferred fields now (while Redis runs a transaction, say)."""
        rest = vars(self).pop(_REST, None)
        if rest is not None:
            vars(self).update(rest())

    def __getattr__(self, name: str) -> Any:
        # only called for a name the instance does not hold yet
        if name.startswith("__") or _REST not in vars(self):
            raise AttributeError(name)
        self.fill()
        return getattr(self, name)


def complete(instance: object) -> None:
    """Make an instance's deferred fields now, if it has any."""
    if isinstance(instance, Deferred):
        instance.fill()
