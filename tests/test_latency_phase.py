"""The latency phase's schedule (worker/bench/latency_phase.py), on a virtual clock: several
systems' bursts interleaved so that each sees the host's same seconds without their rounds
running at once: bursts 10 ms apart or more go to every system within each period, half a
period apart for two; closer ones (events one by one) go a slice at a time to each in turn."""

from __future__ import annotations

import numpy as np
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
    run_bursts([a, b], 0.1, 1000, 20, phase_ms=0)  # 20 events every 20 ms to each, for 0.1 s
    assert a.bursts == [(t, 20) for t in (0, 20, 40, 60, 80)]
    assert b.bursts == [(t, 20) for t in (10, 30, 50, 70, 90)]


def test_bursts_close_together_go_a_slice_at_a_time_to_each_system_in_turn(clock):
    a, b = Recorder(clock), Recorder(clock)
    # one event a ms, 10 ms slices
    run_bursts([a, b], 0.02, 1000, 1, slice_seconds=0.01, phase_ms=0)
    times = [t for t, n in a.bursts + b.bursts if n == 1]
    assert len(times) == len(a.bursts) + len(b.bursts) == 40  # each its 20 ms, a ms apart
    assert [t for t, _ in a.bursts] == [*range(0, 10), *range(20, 30)]  # slices 1 and 3
    assert [t for t, _ in b.bursts] == [*range(10, 20), *range(30, 40)]  # slices 2 and 4


def test_three_systems_closer_than_5_ms_apart_take_slices(clock):
    a, b, c = Recorder(clock), Recorder(clock), Recorder(clock)
    # 10 ms bursts: 3.3 ms apart
    run_bursts([a, b, c], 0.02, 1000, 10, slice_seconds=0.02, phase_ms=0)
    assert [t for t, _ in a.bursts] == [0, 10]
    assert [t for t, _ in b.bursts] == [20, 30] and [t for t, _ in c.bursts] == [40, 50]


def test_one_system_gets_a_burst_every_period(clock):
    a = Recorder(clock)
    run_bursts([a], 0.05, 1000, 10, phase_ms=0)
    assert a.bursts == [(t, 10) for t in (0, 10, 20, 30, 40)]


def test_each_burst_comes_at_a_random_point_of_its_ms(clock):
    """The ids time entry and score in whole ms: bursts at one point of the ms would bias
    every latency of a run the same way (up to half a ms); at random points they average out."""
    a, b = Recorder(clock), Recorder(clock)
    run_bursts([a, b], 20.0, 1000, 10)  # 2,000 bursts each
    for recorder, first in ((a, 0.0), (b, 5.0)):
        times = np.array([t for t, _ in recorder.bursts])
        late = times - (first + 10.0 * np.arange(len(times)))
        assert len(times) == 2000 and (late >= 0).all() and (late < 1.0).all()
        quarters = np.bincount((late * 4).astype(int), minlength=4) / len(late)
        assert (abs(quarters - 0.25) < 0.04).all(), quarters


def test_poisson_arrivals_come_one_by_one_at_random_gaps_of_the_rate(clock):
    """Many users' clicks: one event at a time, the gaps exponential with mean 1 / rate (their
    spread as large as their mean), at random points of the ms."""
    a = Recorder(clock)
    run_bursts([a], 20.0, 1000, 10, poisson=True)
    times = np.array([t for t, _ in a.bursts])
    assert {n for _, n in a.bursts} == {1}
    assert abs(len(times) - 20_000) < 600  # ~20,000 events in 20 s, ± 4 standard deviations
    gaps = np.diff(times)
    assert abs(gaps.mean() - 1.0) < 0.03 and abs(gaps.std() - 1.0) < 0.05
    quarters = np.bincount(((times % 1.0) * 4).astype(int), minlength=4) / len(times)
    assert (abs(quarters - 0.25) < 0.02).all(), quarters


def test_poisson_arrivals_to_several_systems_go_a_slice_at_a_time(clock):
    a, b = Recorder(clock), Recorder(clock)
    run_bursts([a, b], 0.2, 1000, 10, slice_seconds=0.1, poisson=True)
    assert all(t < 100 or 200 <= t < 300 for t, _ in a.bursts)
    assert all(100 <= t < 200 or 300 <= t < 400 for t, _ in b.bursts)
    assert 150 < len(a.bursts) < 250 and 150 < len(b.bursts) < 250
