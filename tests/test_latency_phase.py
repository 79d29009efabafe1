"""The latency phase's schedule (worker/bench/latency_phase.py), on a virtual clock: several
systems' bursts interleaved so that each sees the host's same seconds without their rounds
running at once: bursts 10 ms apart or more go to every system within each period, half a
period apart for two; closer ones (events one by one) go a slice at a time to each in turn."""

from __future__ import annotations

import pytest

from worker.bench import latency_phase
from worker.bench.latency_phase import run_bursts


class Clock:
    """time.monotonic and time.sleep of a clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """A system's side of the phase: when each burst came (ms from the start), its size."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.bursts = clock, []

    def burst(self, chunk: int) -> None:
        self.bursts.append((round((self.clock.now - 100.0) * 1000, 6), chunk))


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(latency_phase, "time", fake)
    return fake


def test_bursts_far_apart_go_to_each_system_in_turn_half_a_period_apart(clock):
    a, b = Recorder(clock), Recorder(clock)
    run_bursts([a, b], 0.1, 1000, 20)  # 20 events every 20 ms to each, for 0.1 s
    assert a.bursts == [(t, 20) for t in (0, 20, 40, 60, 80)]
    assert b.bursts == [(t, 20) for t in (10, 30, 50, 70, 90)]


def test_bursts_close_together_go_a_slice_at_a_time_to_each_system_in_turn(clock):
    a, b = Recorder(clock), Recorder(clock)
    run_bursts([a, b], 0.02, 1000, 1, slice_seconds=0.01)  # one event a ms, 10 ms slices
    times = [t for t, n in a.bursts + b.bursts if n == 1]
    assert len(times) == len(a.bursts) + len(b.bursts) == 40  # each its 20 ms, a ms apart
    assert [t for t, _ in a.bursts] == [*range(0, 10), *range(20, 30)]  # slices 1 and 3
    assert [t for t, _ in b.bursts] == [*range(10, 20), *range(30, 40)]  # slices 2 and 4


def test_three_systems_closer_than_5_ms_apart_take_slices(clock):
    a, b, c = Recorder(clock), Recorder(clock), Recorder(clock)
    run_bursts([a, b, c], 0.02, 1000, 10, slice_seconds=0.02)  # 10 ms bursts: 3.3 ms apart
    assert [t for t, _ in a.bursts] == [0, 10]
    assert [t for t, _ in b.bursts] == [20, 30] and [t for t, _ in c.bursts] == [40, 50]


def test_one_system_gets_a_burst_every_period(clock):
    a = Recorder(clock)
    run_bursts([a], 0.05, 1000, 10)
    assert a.bursts == [(t, 10) for t in (0, 10, 20, 30, 40)]
