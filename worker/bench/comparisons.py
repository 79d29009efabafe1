"""What the scaling bench compares, round after round, with the ratios' medians and their
intervals: partition counts in turn (`compare_partitions`) or side by side
(`compare_interleaved`), and one worker on a cluster against one Redis (`compare_cluster`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from worker.bench.latency_phase import (
    Feed,
    run_bursts,
    whole_ms_percentile,
)
from worker.bench.runs import (
    Servers,
    announced,
    run_one,
    seen_percentiles,
    start_workers,
    stop_workers,
)
from worker.bench.uncertainty import median_interval


def compare_partitions(
    servers: Servers, n: int, sizes: list[int], args, events: list, model: Path, logs: Path
) -> list[list[float]]:  # fmt: skip
    """Alternated rounds of `n` workers at each partition count in `sizes`: each run's p50 as
    a reader of the scores saw it (on a cluster, where it cannot read them all at once, the
    entry-id p50), and each round's ratios to the first count's; on one Redis also the p50
    from an event's entry to its score's (their ids' whole ms: the commit, without the
    producer's send and the reader's wake) and its ratios. Then each ratio's median over the
    rounds. The seen p50s, seconds, by round. Every other round runs the counts in reverse,
    so that going first or last (after the other's run) weighs on each count alike."""
    rounds: list[list[float]] = []
    entered: list[list[float]] = []  # entry to score, by round
    for r in range(args.rounds):
        by_size = {}
        for size in sizes if r % 2 == 0 else sizes[::-1]:
            by_size[size] = run_one(servers, n, _with(args, partitions=size), events, model,
                                    logs)  # fmt: skip
        runs = [by_size[size] for size in sizes]
        _report_round(r, sizes, [run.seen_p50 for run in runs], [run.p50 for run in runs],
                      rounds, entered)  # fmt: skip
    _report_medians(sizes, rounds, entered)
    return rounds


def compare_interleaved(
    servers: Servers, n: int, sizes: list[int], args, model: Path, logs: Path
) -> list[list[float]]:  # fmt: skip
    """`compare_partitions` with the counts side by side: each on a Redis and `n` workers of
    its own, started once, their bursts interleaved in every round's latency phase
    (latency_phase.run_bursts). A round's runs are then the same seconds: on a shared VM the
    host's drift moved one count's p50 by a third from one minute to the next, and in turn
    it weighed on one count's run, not the other's. Every other round the counts take their
    turns in reverse order; a second's phase before the rounds is not counted.
    The first count runs on `servers`, each other on a Redis of its own."""
    systems: list[tuple[Servers, list]] = []
    try:
        for k, size in enumerate(sizes):
            systems.append((servers if k == 0 else Servers(False, 0, args.aof), []))
            systems[-1][1].extend(start_workers(systems[-1][0], n, _with(args, partitions=size),
                                                model, logs))  # fmt: skip
        for system, procs in systems:
            announced(system, n, procs)
        rounds: list[list[float]] = []
        entered: list[list[float]] = []
        rngs = [np.random.default_rng(2) for _ in sizes]  # each count sent the same events
        for r in range(-1, args.rounds):
            order = list(range(len(sizes)))[:: 1 if r % 2 == 0 else -1]
            feeds = {i: Feed(systems[i][0].client, sizes[i], args.users, systems[i][0].url,
                             rngs[i]) for i in order}  # fmt: skip
            seconds = args.latency_seconds if r >= 0 else 1.0
            run_bursts([feeds[i] for i in order], seconds, args.latency_rate,
                       args.latency_every_ms, poisson=args.latency_poisson)  # fmt: skip
            got = [feeds[i].latencies(systems[i][1]) for i in range(len(sizes))]
            if r >= 0:
                _report_round(r, sizes, [seen_percentiles(seen)[0] for _, seen in got],
                              [whole_ms_percentile(lat, 50) / 1e3 for lat, _ in got], rounds,
                              entered)  # fmt: skip
        _report_medians(sizes, rounds, entered)
        return rounds
    finally:
        for k, (system, procs) in enumerate(systems):
            stop_workers(procs)
            if k > 0:
                system.close()


def _report_round(
    r: int, sizes: list[int], seen: list[float], entry: list[float], rounds: list[list[float]],
    entered: list[list[float]],
) -> None:  # fmt: skip
    """Print round r's p50s (seconds; the reader's, or the entry ids' where there is no
    reader) with their ratios to the first count's, and the entry ids' beside a reader's;
    keep them in `rounds` and `entered`."""
    reader = not any(math.isnan(x) for x in seen)
    p50s = seen if reader else entry
    rounds.append(p50s)
    each = ", ".join(f"P = {k} {x * 1e3:.2f} ms" for k, x in zip(sizes, p50s, strict=True))
    line = f"  round {r + 1}: {each} ({_ratios(sizes, p50s)})"
    if reader:
        entered.append(entry)
        ids = ", ".join(f"{x * 1e3:.2f}" for x in entry)
        line += f"; entry to score {ids} ms ({_ratios(sizes, entry)})"
    print(line, flush=True)


def _report_medians(
    sizes: list[int], rounds: list[list[float]], entered: list[list[float]]
) -> None:
    """Each count's ratio to the first's over the rounds: the p50s', then the entry ids'."""
    for k, size in enumerate(sizes[1:], start=1):
        _print_median(f"P = {size} / P = {sizes[0]}", [_ratio(p50s, k) for p50s in rounds])
        if entered:
            _print_median(f"entry to score, P = {size} / P = {sizes[0]}",
                          [_ratio(p50s, k) for p50s in entered])  # fmt: skip


def _print_median(what: str, ratios: list[float]) -> None:
    """The ratios' median over the rounds, their range and the median's 90% interval."""
    ratios = sorted(ratios)
    low, high = median_interval(ratios)
    print(f"{what}: median {np.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) over "
          f"{len(ratios)} round(s); the median's 90% interval {low:.2f}-{high:.2f}x (bootstrap "
          "over the rounds)")  # fmt: skip


def compare_cluster(
    cluster: Servers, one: Servers, n: int, args, events: list, model: Path, logs: Path
) -> list[tuple[float, float, float]]:  # fmt: skip
    """Alternated pairs of `n` workers on the cluster and on one Redis (one Redis first every
    other pair): each pair's events/s, Redis CPU per event (the primaries') and entry-id p50,
    the cluster's over one Redis's; then their medians and the lowest events/s ratio. The
    ratios, by pair."""
    sides = [(cluster, args), (one, _with(args, cluster=False))]
    pairs = []
    for r in range(args.rounds):
        # in reverse every other pair: going first weighs on each alike
        ran = {id(servers): run_one(servers, n, how, events, model, logs)
               for servers, how in (sides if r % 2 == 0 else sides[::-1])}  # fmt: skip
        c, o = ran[id(cluster)], ran[id(one)]
        cpu = (c.per_event_us(c.redis_cpu), o.per_event_us(o.redis_cpu))
        pairs.append((c.rate / o.rate, cpu[0] / cpu[1], c.p50 / o.p50 if o.p50 > 0 else math.nan))
        rate, redis_cpu, p50 = pairs[-1]
        print(f"  pair {r + 1}: events/s {c.rate:,.0f} / {o.rate:,.0f} ({rate:.2f}x), Redis "
              f"µs/event {cpu[0]:.1f} / {cpu[1]:.1f} ({redis_cpu:.2f}x), p50 ms "
              f"{c.p50 * 1e3:.1f} / {o.p50 * 1e3:.1f} ({p50:.2f}x)", flush=True)  # fmt: skip
    rates, cpus, p50s = (sorted(x) for x in zip(*pairs, strict=True))
    print(f"cluster / one Redis over {len(pairs)} pair(s): events/s median "
          f"{np.median(rates):.2f}x (lowest {rates[0]:.2f}x), Redis CPU per event median "
          f"{np.median(cpus):.2f}x, p50 median {np.median(p50s):.2f}x")  # fmt: skip
    return pairs


def _with(args: argparse.Namespace, **changes: object) -> argparse.Namespace:
    """The bench's arguments with these changed (one side of a comparison)."""
    return argparse.Namespace(**{**vars(args), **changes})


def _ratio(p50s: list[float], k: int) -> float:
    """The k-th count's p50 over the first's; nan when the first's is not above 0 (whole ms
    of ids can say 0)."""
    return p50s[k] / p50s[0] if p50s[0] > 0 else math.nan


def _ratios(sizes: list[int], p50s: list[float]) -> str:
    """Each count's p50 against the first's, as text."""
    return ", ".join(f"P = {s} / P = {sizes[0]}: {_ratio(p50s, k):.2f}x"
                     for k, s in enumerate(sizes[1:], start=1))  # fmt: skip
