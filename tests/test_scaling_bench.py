"""`intentstream bench --workers`: runs real workers and reports every column (a smoke run;
its figures are measured by hand, never asserted); the score observer reads every latency
event's score once."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import redis

from tests.conftest import run_cli
from tests.workers import wait_for
from worker.bench.latency_phase import whole_ms_percentile
from worker.bench.observer import Observer, entries_after, sent_id
from worker.bench.uncertainty import median_interval


def test_scaling_bench_reports_rate_latency_cpu_and_fleet_arithmetic():
    result = run_cli(
        "bench", "--workers", "1,2", "--partitions", "4", "--events", "3000", "--users", "300",
        "--latency-seconds", "0.5", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert re.search(r"\d+ cores", out.splitlines()[0])
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\d+)\s+([\d,]+)" + r"\s+([\d.]+)" * 7 + r"\s*$", line)
        if m:
            rows[int(m[1])] = [float(x.replace(",", "")) for x in m.groups()[1:]]
    assert set(rows) == {1, 2}
    for rate, p50, p99, worker_us, redis_us, atomic_us, seen50, seen99 in rows.values():
        assert rate > 0 and 0 <= p50 <= p99 and worker_us > 0 and redis_us > 0
        assert atomic_us > 0  # inside EXEC (the commits) and the scripts
        assert 0 < seen50 <= seen99  # as the score observer read them, to the µs
    for target in ("10,000", "100,000", "1,000,000"):
        assert re.search(rf"{target} events/s: +\d+ shard\(s\), +\d+ worker\(s\)", out)


def test_partition_counts_alternate_in_rounds_with_their_ratios_to_the_first():
    """Several --partitions: each round runs one worker at each count in turn; each round's
    seen p50s and their ratio to the first's, then the median ratio over the rounds. Events
    published one by one (--latency-every-ms: 200 events/s every 5 ms)."""
    result = run_cli(
        "bench", "--workers", "1", "--partitions", "1,2", "--rounds", "2", "--events", "400",
        "--users", "100", "--latency-seconds", "0.5", "--latency-rate", "200",
        "--latency-every-ms", "5", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"at 200 events/s \(a burst every 5 ms\)", result.stdout)
    rounds = re.findall(r"round (\d): P = 1 ([\d.]+) ms, P = 2 ([\d.]+) ms \(P = 2 / P = 1: "
                        r"([\d.]+)x\)", result.stdout)  # fmt: skip
    assert [r[0] for r in rounds] == ["1", "2"]
    bounds = []
    for _, one, two, ratio in rounds:
        assert float(one) > 0 and float(two) > 0
        assert ratio_of_rounded(ratio, two, one)  # of the unrounded p50s
        bounds.append(rounded_ratio_bounds(two, one))
    median = re.search(r"P = 2 / P = 1: median ([\d.]+)x \(([\d.]+)-([\d.]+)\) over 2 round\(s\); "
                       r"the median's 90% interval ([\d.]+)-([\d.]+)x", result.stdout)  # fmt: skip
    assert median
    # the median of two rounds is their mean: within the mean of their ratios' bounds
    low, high = (sum(b[i] for b in bounds) / 2 for i in (0, 1))
    assert low - 0.005 <= float(median[1]) <= high + 0.005
    assert float(median[2]) <= float(median[4]) <= float(median[5]) <= float(median[3])
    # beside the reader's, the entry ids' p50s (the commit alone) and their median ratio
    entry = re.findall(r"; entry to score [-\d.]+, [-\d.]+ ms \(P = 2 / P = 1: ", result.stdout)
    assert len(entry) == 2
    assert re.search(r"entry to score, P = 2 / P = 1: median ([\d.]+|nan)x", result.stdout)


def test_interleaved_counts_run_side_by_side_each_round_with_both_latencies():
    """--interleaved: each count on a Redis and a worker of its own, started once, their bursts
    interleaved in every round; a round prints the reader's p50s and the entry ids', each
    with its ratio, then both medians. Asked for without what it needs: a usage error."""
    result = run_cli(
        "bench", "--workers", "1", "--partitions", "1,2", "--interleaved", "--rounds", "2",
        "--users", "100", "--latency-seconds", "0.5", "--latency-rate", "200",
        "--latency-every-ms", "5", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0 events backlog" in result.stdout  # latency alone: no backlog to score first
    rounds = re.findall(r"round (\d): P = 1 ([\d.]+) ms, P = 2 ([\d.]+) ms \(P = 2 / P = 1: "
                        r"([\d.]+)x\); entry to score ([-\d.]+), ([-\d.]+) ms \(P = 2 / P = 1: "
                        r"([\d.]+|nan)x\)", result.stdout)  # fmt: skip
    assert [r[0] for r in rounds] == ["1", "2"]
    for _, one, two, ratio, entry_one, entry_two, entry_ratio in rounds:
        assert ratio_of_rounded(ratio, two, one)
        if float(entry_one) > 0:
            assert ratio_of_rounded(entry_ratio, entry_two, entry_one)
    assert re.search(r"^P = 2 / P = 1: median [\d.]+x", result.stdout, re.M)
    assert re.search(r"^entry to score, P = 2 / P = 1: median ([\d.]+|nan)x", result.stdout, re.M)
    refused = run_cli("bench", "--workers", "1", "--partitions", "8", "--interleaved")
    assert refused.returncode == 2
    assert "--interleaved compares several --partitions on one Redis" in refused.stderr


def test_the_cluster_against_one_redis_in_alternated_pairs_with_their_ratios():
    """--cluster --against-one: each pair runs the worker on the cluster, then on one Redis;
    each ratio is the cluster's figure over one Redis's, then the medians over the pairs."""
    result = run_cli(
        "bench", "--workers", "1", "--partitions", "4", "--cluster", "--replicas", "0",
        "--against-one", "--rounds", "2", "--events", "600", "--users", "100",
        "--latency-seconds", "0.5", "--latency-rate", "200", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    pairs = re.findall(r"pair (\d): events/s ([\d,]+) / ([\d,]+) \(([\d.]+)x\), Redis "
                       r"µs/event ([\d.]+) / ([\d.]+) \(([\d.]+)x\), p50 ms ([-\d.]+) / "
                       r"([-\d.]+) \(([\d.]+x|nanx)\)", result.stdout)  # fmt: skip
    assert [p[0] for p in pairs] == ["1", "2"]
    rates = []
    for _, c_rate, o_rate, rate, c_cpu, o_cpu, cpu, c_p50, o_p50, p50 in pairs:
        c_rate, o_rate = c_rate.replace(",", ""), o_rate.replace(",", "")
        assert float(c_rate) > 0 and float(o_rate) > 0
        # each ratio is of the unrounded figures: within what their printed rounding allows
        assert ratio_of_rounded(rate, c_rate, o_rate)
        assert ratio_of_rounded(cpu, c_cpu, o_cpu)
        if p50 != "nanx":  # no p50 on a run too short to have one
            assert ratio_of_rounded(p50[:-1], c_p50, o_p50)
        rates.append(float(c_rate) / float(o_rate))
    summary = re.search(r"over 2 pair\(s\): events/s median ([\d.]+)x \(lowest ([\d.]+)x\)",
                        result.stdout)  # fmt: skip
    assert summary and abs(float(summary[1]) - sum(rates) / 2) < 0.01 * float(summary[1]) + 0.01
    assert abs(float(summary[2]) - min(rates)) < 0.01 * float(summary[2]) + 0.01


def _half(printed: str) -> float:
    """Half the last printed decimal's unit: how far rounding may have moved the figure."""
    return 0.5 * 10.0 ** -len(printed.partition(".")[2])


def rounded_ratio_bounds(num: str, den: str) -> tuple[float, float]:
    """The lowest and highest num / den can be when both were printed rounded to the
    decimals they show (p50s of 0.3 and 0.1 ms are 0.25-0.35 and 0.05-0.15)."""
    n, d = float(num), float(den)
    low = max(n - _half(num), 0.0) / (d + _half(den))
    high = (n + _half(num)) / (d - _half(den)) if d > _half(den) else float("inf")
    return low, high


def ratio_of_rounded(ratio: str, num: str, den: str) -> bool:
    """Whether a printed ratio can be num / den, all three printed rounded."""
    low, high = rounded_ratio_bounds(num, den)
    return low - _half(ratio) <= float(ratio) <= high + _half(ratio)


def test_a_ratio_is_checked_within_the_rounding_of_its_printed_figures():
    assert ratio_of_rounded("3.65", "0.3", "0.1")  # 0.26 / 0.07: the flaky case before
    assert ratio_of_rounded("1.02", "2040", "2000")
    assert not ratio_of_rounded("1.50", "1.0", "1.0")
    assert not ratio_of_rounded("0.10", "0.3", "0.1")


def test_latency_percentiles_in_whole_ms_are_read_within_their_ms():
    """Latencies that are differences of two ids' ms: a percentile says where within its ms
    it falls, not only which ms (half 2s, half 3s: the median is the boundary, 2.5)."""
    assert whole_ms_percentile(np.array([2.0] * 50 + [3.0] * 50), 50) == 2.5
    assert whole_ms_percentile(np.array([2.0] * 4), 50) == 2.0  # the middle of its ms
    assert abs(whole_ms_percentile(np.array([1.0] * 10 + [2.0] * 30 + [9.0] * 10), 50) - 2.0) < 1e-9
    assert whole_ms_percentile(np.array([1.0] * 99 + [40.0]), 99) == 1.5


def test_the_observer_sees_each_sent_score_once_from_its_send(redis_server):
    """Score entries of two streams, some carrying a send time (sent_id): the observer,
    started before them, returns one latency each, from the send to its arrival."""
    r = redis.Redis.from_url(redis_server.url)
    streams = {"s:{0}": b"0-0", "s:{1}": b"0-0"}
    observer = Observer(redis_server.url, streams)
    before = time.time()
    for n in range(30):
        r.xadd(f"s:{{{n % 2}}}", {"event_id": sent_id(n) if n % 3 else f"plain-{n}"})
    seen = observer.stop()
    assert len(seen) == 20
    assert (seen >= 0).all() and (seen <= (time.time() - before) * 1000 + 1).all()


def test_one_read_of_the_observer_brings_every_stream_a_transaction_wrote(redis_server):
    """Redis answers a blocked XREAD with the first stream written alone; the read behind it
    in the same send brings the rest, each entry once (the reader's extra round trip would
    otherwise grow with the partitions)."""
    r = redis.Redis.from_url(redis_server.url)
    names = [f"s:{{{p}}}" for p in range(3)]
    last = {name: r.xadd(name, {"n": 0}) for name in names}
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(entries_after(redis.Redis.from_url(
        redis_server.url), dict(last), 5000)))  # fmt: skip
    reader.start()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, 10)
    with r.pipeline(transaction=True) as pipe:
        for name in names:
            pipe.xadd(name, {"n": 1})
            pipe.xadd(name, {"n": 2})
        pipe.execute()
    reader.join(10)
    assert sorted((s.decode(), [f[b"n"] for _, f in e]) for s, e in got) == [
        (name, [b"1", b"2"]) for name in names
    ]


def test_the_medians_interval_holds_the_median_and_narrows_with_agreeing_rounds():
    spread = [1.07, 1.11, 1.15, 1.16, 1.24, 1.25, 1.29, 1.30, 1.30, 1.31, 1.33]
    low, high = median_interval(spread)
    assert spread[0] <= low <= float(np.median(spread)) <= high <= spread[-1]
    assert median_interval([1.2] * 5) == (1.2, 1.2)
    tight = median_interval([1.19, 1.2, 1.2, 1.21, 1.2])
    assert high - low > tight[1] - tight[0]
