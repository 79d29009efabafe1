"""What intent rules cost the worker (`intentstream bench --rules 3 [--rules-fire 0.9]`).

Rounds of the in-process worker (the bench's variant a) over the same backlog, the variants
alternated in each round and rotated between rounds:
  none    no rules set
  quiet   N rules whose threshold no score reaches (`above` 1.0, the highest a rule takes:
          only a sigmoid saturated to exactly 1 would reach it):
          each batch still reads, steps and writes every user's rule state
  fire    the same N rules at the --rules-fire quantile of the warm-up's scores: actions,
          each with its reasons (a leave-one-out replay of its session)
The rules between them take every path of the rule step: rule 0 lists event types (and every
third after it), rule 1 needs 3 session events, rule 2 has a 15-minute cooldown.

Worker CPU is this process's user + system time from the first tick to the last (start-up
and the kernels' warm-up excluded); Redis CPU is INFO cpu over the same run. Figures are
medians over rounds; ratios are medians of the same round's ratios.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis

from worker.bench.inprocess import timed_backlog
from worker.bench.workload import ACTIONS, KEYS, SCORES, preload
from worker.rules.definition import MAX_RULES, Rule, make_rule
from worker.rules.store import set_rule

QUIET_ABOVE = 1.0  # a rule's highest threshold: only a score of exactly 1 would fire
LISTED_TYPES = ("add_to_cart", "checkout", "coupon")
COOLDOWN_MS = 15 * 60_000
MIN_EVENTS = 3
WARM_UP_EVENTS = 20_000
VARIANTS = ("none", "quiet", "fire")


def rule_count(text: str) -> int:
    """--rules: 0 (no rules bench) to MAX_RULES."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= n <= MAX_RULES:
        raise argparse.ArgumentTypeError(f"{n}: from 0 to {MAX_RULES} rules")
    return n


def quantile(text: str) -> float:
    """--rules-fire: a quantile of the scores in [0, 1) (0: no firing variant)."""
    try:
        q = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= q < 1.0:
        raise argparse.ArgumentTypeError(f"{q}: a quantile from 0 (none) to below 1")
    return q


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The rules bench's flags on the bench's parser."""
    p.add_argument("--rules", type=rule_count, default=0, metavar="N",
                   help="run the rules bench instead of the variants: the worker without "
                   "rules, with N rules none of which fires, and with them firing, "
                   "alternated --repeat times")  # fmt: skip
    p.add_argument("--rules-fire", type=quantile, default=0.9, metavar="Q",
                   help="the firing variant's threshold: this quantile of the warm-up's "
                   "scores (0: no firing variant)")  # fmt: skip


def bench_rules(n: int, above: float) -> list[Rule]:
    """n rules at `above` that between them take every path of the rule step: a type list,
    a minimum of session events, a cooldown (in turn)."""
    shapes = [{"types": LISTED_TYPES}, {"min_events": MIN_EVENTS}, {"cooldown_ms": COOLDOWN_MS}]
    return [make_rule(name=f"bench-{i}", above=above, **shapes[i % 3]) for i in range(n)]


def describe(rules: list[Rule]) -> str:
    """The rules' shapes, one clause each."""

    def one(rule: Rule) -> str:
        if rule.types:
            return f"types {','.join(rule.types)}"
        if rule.min_events > 1:
            return f"min_events {rule.min_events}"
        return f"cooldown {rule.cooldown_ms // 60_000}m"

    return "; ".join(f"{rule.name} {one(rule)}" for rule in rules)


def score_quantile(r: redis.Redis, q: float) -> float:
    """The q quantile of the scores in partition 0's score stream (the warm-up's)."""
    scores = [float(f[b"score"]) for _, f in r.xrange(SCORES)]
    if not scores:
        raise RuntimeError("no scores to set the firing threshold from (run the warm-up first)")
    return float(np.quantile(scores, q))


@dataclass(frozen=True)
class Run:
    """One variant's run over the backlog."""

    variant: str
    rate: float  # events/s
    worker_us: float  # worker CPU per event
    redis_us: float  # Redis CPU per event
    actions: int
    seconds: float
    worker_cpu: float  # seconds

    @property
    def actions_per_second(self) -> float:
        return self.actions / self.seconds


def run_once(
    r: redis.Redis, url: str, model_path: Path, events: list[dict], args: argparse.Namespace,
    variant: str, rules: list[Rule],
) -> Run:  # fmt: skip
    """Preload, set the rules, and time the in-process worker over the backlog."""
    preload(r, events, args.event_ids)
    for rule in rules:
        set_rule(r, KEYS, rule)
    run = timed_backlog(r, url, model_path, len(events), args.batch_size, args.history_events)
    if rules and not _has_rule_states(r):
        raise RuntimeError("the worker wrote no rule states: the rules were not in force")
    return Run(variant, run.rate, run.worker_us, run.redis_us, r.xlen(ACTIONS), run.seconds,
               run.worker_cpu)  # fmt: skip


def _has_rule_states(r: redis.Redis) -> bool:
    key = next(r.scan_iter(match=KEYS.state_match(0), count=100), None)
    return key is not None and r.hexists(key, "rules")


def _ratios(runs: dict[str, list[Run]], variant: str, of) -> list[float]:
    return sorted(of(x) / of(y) for x, y in zip(runs[variant], runs["none"], strict=True))


def _median(values) -> float:
    return float(np.median(list(values)))


def print_table(runs: dict[str, list[Run]], names: dict[str, str]) -> None:
    """Medians per variant, the ratios against no rules, and the cost of an action."""
    print(f"{'variant':<34} {'events/s':>9} {'worker µs/ev':>12} {'redis µs/ev':>11} "
          f"{'actions':>8} {'actions/s':>9}  runs (events/s)")  # fmt: skip
    for variant, rs in runs.items():
        print(f"{names[variant]:<34} {_median(x.rate for x in rs):>9,.0f} "
              f"{_median(x.worker_us for x in rs):>12.2f} "
              f"{_median(x.redis_us for x in rs):>11.2f} "
              f"{_median(x.actions for x in rs):>8,.0f} "
              f"{_median(x.actions_per_second for x in rs):>9,.0f}  "
              + " ".join(f"{x.rate:,.0f}" for x in rs))  # fmt: skip
    print("\nagainst no rules (medians of same-round ratios):")
    for variant in (v for v in runs if v != "none"):
        rates = _ratios(runs, variant, lambda x: x.rate)
        cpus = _ratios(runs, variant, lambda x: x.worker_us)
        reds = _ratios(runs, variant, lambda x: x.redis_us)
        goal = "; goal <= 1.10" if variant == "quiet" else ""
        print(f"  {names[variant]}: events/s {np.median(rates):.3f}, worker CPU per event "
              f"{np.median(cpus):.3f} ({', '.join(f'{v:.3f}' for v in cpus)}){goal}, Redis CPU "
              f"{np.median(reds):.3f}")  # fmt: skip
    if "fire" in runs and "quiet" in runs:
        per_action = [(f.worker_cpu - q.worker_cpu) / max(1, f.actions) * 1e6
                      for f, q in zip(runs["fire"], runs["quiet"], strict=True)]  # fmt: skip
        print(f"an action costs {np.median(per_action):.1f} µs of worker CPU (firing minus none "
              f"firing, over its actions; rounds: "
              f"{', '.join(f'{v:.1f}' for v in sorted(per_action))})")  # fmt: skip


def run_rules_bench(
    r: redis.Redis, url: str, model_path: Path, events: list[dict], args: argparse.Namespace
) -> dict[str, list[Run]]:
    """Alternate the variants over --repeat rounds, print each run and the table. Call it
    after the bench's warm-up: the firing threshold comes from the scores it left."""
    variants: dict[str, list[Rule]] = {
        "none": [], "quiet": bench_rules(args.rules, QUIET_ABOVE),
    }  # fmt: skip
    names = {"none": "no rules", "quiet": f"{args.rules} rules, none firing"}
    if args.rules_fire > 0:
        above = score_quantile(r, args.rules_fire)
        variants["fire"] = bench_rules(args.rules, above)
        names["fire"] = f"{args.rules} rules firing (p{args.rules_fire * 100:g} = {above:.4f})"
    print(f"intent rules: {describe(variants['quiet'])}; none firing: above {QUIET_ABOVE}")
    # The rule step's and the reasons' kernels load on their first batch: not in a round.
    warm = variants.get("fire", variants["quiet"])
    run_once(r, url, model_path, events[:WARM_UP_EVENTS], args, "warm-up", warm)
    runs: dict[str, list[Run]] = {v: [] for v in variants}
    order = list(variants)
    for k in range(max(1, args.repeat)):
        for variant in order[k % len(order) :] + order[: k % len(order)]:
            run = run_once(r, url, model_path, events, args, variant, variants[variant])
            runs[variant].append(run)
            print(f"  {names[variant]:<34} {run.rate:>9,.0f} ev/s  worker {run.worker_us:6.2f} "
                  f"µs/ev  redis {run.redis_us:5.2f} µs/ev  {run.actions:>7,} actions",
                  flush=True)  # fmt: skip
    print()
    print_table(runs, names)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return runs
