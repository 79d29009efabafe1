"""Ctrl-C held back across a step that must not be cut between its writes (a model published,
then gated and promoted): the step finishes, says what it did, then the command exits 130."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_interrupts() -> Iterator[list[int]]:
    """Within the block a SIGINT is recorded (the list yielded gets its number), not raised;
    after it, a recorded one raises KeyboardInterrupt. Main thread only (Python's rule)."""
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda sig, _frame: got.append(sig))
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, previous)
    if got:
        raise KeyboardInterrupt
