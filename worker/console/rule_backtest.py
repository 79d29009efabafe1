"""A rule's backtest before it is saved: the newest retained events replayed through the
worker's own pipeline (worker/commands/backtest.py's path) with the rule and copies of it at
other thresholds, all in one replay: the rule's figures, its actions per day, and precision
and recall against the threshold."""

from __future__ import annotations

from collections import Counter

from worker.commands.backtest import backtest_report, batches_of
from worker.common.connection import Client
from worker.common.keys import Keys
from worker.common.partition_count import recorded_partitions
from worker.common.settings import Settings
from worker.console.current_model import CurrentModel
from worker.engine.compute.replay import replay
from worker.rules.definition import Rule, RuleSet
from worker.rules.step import RuleTable

# The thresholds the sweep tries beside the rule's own (one replay: up to 64 rules).
SWEEP = tuple(round(0.05 * k, 2) for k in range(1, 20))
PAGE = 10_000
DAY_MS = 86_400_000


class BacktestError(ValueError):
    """Nothing to backtest on (no model, no retained events)."""


def newest_entries(client: Client, keys: Keys, partitions: int, limit: int) -> dict[int, list]:
    """Each partition's newest `limit` retained entries, oldest first (XREVRANGE pages)."""
    streams: dict[int, list] = {}
    for p in range(partitions):
        out: list = []
        end = "+"
        while len(out) < limit:
            page = client.xrevrange(keys.events(p), end, "-", count=min(PAGE, limit - len(out)))
            if not page:
                break
            out += page
            end = "(" + page[-1][0].decode()
        streams[p] = [[entry_id, _flat(fields)] for entry_id, fields in reversed(out)]
    return streams


def _flat(fields: dict) -> list[bytes]:
    """A stream entry's fields as the flat list XRANGE's raw reply holds."""
    return [item for pair in fields.items() for item in pair]


def sweep_rules(rule: Rule) -> list[Rule]:
    """Copies of the rule at each SWEEP threshold, re-arming the same distance below."""
    gap = rule.above - rule.rearm
    names = {f"sweep-{round(t * 100):02d}": t for t in SWEEP}
    return [
        rule.model_copy(update={"name": name, "above": t, "rearm_below": max(0.0, t - gap)})
        for name, t in names.items()
        if name != rule.name
    ]


def run_backtest(
    client: Client, keys: Keys, settings: Settings, models: CurrentModel, rule: Rule, limit: int
) -> dict:
    """The rule's figures, actions per day and the threshold sweep on the retained events."""
    model = models.get()
    if model is None:
        raise BacktestError("no current model in the registry: nothing to backtest with")
    partitions = recorded_partitions(client, keys) or settings.partitions
    streams = newest_entries(client, keys, partitions, limit)
    events = sum(len(entries) for entries in streams.values())
    if not events:
        raise BacktestError("no retained events to backtest on")
    sweep = sweep_rules(rule)
    ruleset = RuleSet(rules=(rule, *sweep))
    batches = batches_of(streams, partitions, settings.batch_size, settings.max_ts_skew_ms,
                         tuple(model.input_names))  # fmt: skip
    run = replay(batches, model, RuleTable.of(ruleset.rules, 0), settings.history_events,
                 settings.resend_window())  # fmt: skip
    report = backtest_report(run, ruleset, model)
    per_day = Counter(a["ts"] // DAY_MS for a in report["actions"] if a["rule"] == rule.name)
    curve = sorted(
        (r.above, report["rules"][r.name]["precision"], report["rules"][r.name]["recall"])
        for r in [*sweep, rule]
    )
    return {
        "model": report["model"],
        "events": report["events"],
        "label_type": report["label_type"],
        "figures": report["rules"][rule.name],
        "per_day": [(day * DAY_MS, n) for day, n in sorted(per_day.items())],
        "curve": curve,
        "above": rule.above,
        "sample": [a for a in report["actions"] if a["rule"] == rule.name][:10],
    }
