"""`intentstream publish --synthetic` dates its backlog as recent history, unless told a start."""

from __future__ import annotations

import argparse

from worker.commands.publish import synthetic_backlog


def args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**({"synthetic": 500, "users": 50, "seed": 3, "start_ms": None}
                                 | given))  # fmt: skip


def test_the_backlog_ends_now_in_time_order():
    now = 1_800_000_000_000
    events = synthetic_backlog(args(), now_ms=now)
    stamps = [e["ts"] for e in events]
    assert len(events) == 500 and stamps == sorted(stamps) and stamps[-1] == now
    assert stamps[0] < now - 3_600_000  # hours of history, not one instant


def test_a_start_is_taken_as_given():
    events = synthetic_backlog(args(start_ms=1_700_000_000_000), now_ms=1)
    assert min(e["ts"] for e in events) >= 1_700_000_000_000
    assert events == synthetic_backlog(args(start_ms=1_700_000_000_000), now_ms=2)
