"""The `intentstream rules backtest` command: events replayed through the worker's own
pipeline (compute/replay.py) with a rule set, printing the actions the rules would have
written and, per rule, how often they fire and how well they foretell a purchase."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from model.artifact import label_type_of
from worker.commands.event_files import data_format, read_event_files
from worker.commands.explain import explaining_model, iso_time
from worker.commands.registry_access import registry_of
from worker.common.events import Event
from worker.common.keys import Keys, partition_of
from worker.common.partition_count import recorded_partitions
from worker.common.settings import Settings, SettingsError, load_settings
from worker.engine.compute.batch import Batch, parse_batch
from worker.engine.compute.replay import Replayed, replay
from worker.rules.definition import RuleError, RuleSet, make_rule
from worker.rules.report import rule_report
from worker.rules.step import RuleTable
from worker.rules.store import read_rules

# Event files carry their own times: the timestamp rule's bound on how far ts runs ahead of
# the entry id's time (the arrival) means nothing offline.
NO_SKEW_LIMIT = 2**62


def rules_of_file(path: str) -> RuleSet:
    """A rule set from a JSON file: a list of rules, or {"rules": [...]} (the shape `rules
    list --json` prints)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read --rules {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SettingsError(f"--rules {path}: not JSON ({exc})") from None
    items = doc.get("rules") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise SettingsError(f'--rules {path}: expected a list of rules or {{"rules": [...]}}')
    try:
        return RuleSet(rules=tuple(make_rule(**item) for item in items))
    except (RuleError, TypeError) as exc:
        raise SettingsError(f"--rules {path}: {exc}") from None


def file_entries(
    paths: list[str], partitions: int, format: str = "jsonl", columns: str | None = None
) -> dict[int, list]:
    """Each partition's stream entries of event files (JSON lines, or CSV: `--format`), in
    file order; bad lines are reported on stderr and skipped."""
    read = read_event_files(paths, format, columns)
    events = [Event(**{k: e[k] for k in EVENT_KEYS if k in e}) for e in read]
    extras = [{k: v for k, v in e.items() if k not in EVENT_KEYS} for e in read]
    return event_entries(events, partitions, extras)


EVENT_KEYS = ("user_id", "type", "ts", "event_id")


def event_entries(
    events: Iterable[Event], partitions: int, extras: Iterable[dict] | None = None
) -> dict[int, list]:
    """Each partition's stream entries of the events, in order, with ids 1-0, 2-0, ...: the
    fields a producer would send (user_id, type, ts, event_id, then each event's `extras`,
    the declared inputs' fields, as text)."""
    streams: dict[int, list] = {p: [] for p in range(partitions)}
    more = iter(extras) if extras is not None else None
    for number, e in enumerate(events, start=1):
        fields = [b"user_id", e.user_id.encode(), b"type", e.type.encode()]
        if e.ts is not None:
            fields += [b"ts", str(e.ts).encode()]
        if e.event_id is not None:
            fields += [b"event_id", e.event_id.encode()]
        for k, v in next(more).items() if more is not None else ():
            if v is not None:
                fields += [k.encode(), str(v).encode()]
        streams[partition_of(e.user_id, partitions)].append([f"{number}-0".encode(), fields])
    return streams


def redis_entries(client, keys: Keys, partitions: int, page: int = 10_000) -> dict[int, list]:
    """Each partition's retained stream entries, read with XRANGE pages."""
    streams: dict[int, list] = {}
    for p in range(partitions):
        out, start = [], "-"
        while True:
            entries = client.execute_command("XRANGE", keys.events(p), start, "+", "COUNT", page)
            out += entries
            if len(entries) < page:
                break
            start = "(" + entries[-1][0].decode()
        streams[p] = out
    return streams


def batches_of(
    streams: dict[int, list], partitions: int, size: int, skew: int,
    input_names: tuple[str, ...] = (),
) -> Iterator[Batch]:  # fmt: skip
    """Each partition's entries parsed in batches of `size`, as the worker reads them (with
    the values of the model's declared inputs)."""
    for p, entries in streams.items():
        for i in range(0, len(entries), size):
            yield parse_batch(p, entries[i : i + size], partitions, skew, input_names)


def action_record(action, model: str) -> dict:
    """One action as the actions stream holds it (and `--json` prints it)."""
    return {
        "user_id": action.user_id, "rule": action.rule, "score": action.score,
        "event_id": action.event_id.decode(errors="replace"), "ts": action.ts, "model": model,
        "reasons": json.loads(action.reasons),
    }  # fmt: skip


def cmd_rules_backtest(args: argparse.Namespace) -> int:
    """The `intentstream rules backtest` command; returns its exit code."""
    settings: Settings = load_settings(args)
    if bool(args.data) == bool(args.from_redis):
        raise SettingsError("give either --data FILE or --from-redis")
    data_format(args.format, args.columns)  # a bad --format/--columns fails before any read
    registry = registry_of(args)
    model = explaining_model(args, registry)
    ruleset = rules_of_file(args.rules) if args.rules else read_rules(registry.r, registry.keys)
    if not ruleset.rules:
        raise SettingsError("no rules to backtest: set some (`intentstream rules set`) or give "
                            "--rules FILE")  # fmt: skip
    if args.from_redis:
        partitions = recorded_partitions(registry.r, registry.keys) or settings.partitions
        streams = redis_entries(registry.r, registry.keys, partitions)
        skew = settings.max_ts_skew_ms
    else:
        partitions = 1
        streams = file_entries(args.data, partitions, args.format, args.columns)
        skew = NO_SKEW_LIMIT
    table = RuleTable.of(ruleset.rules, ruleset.version)
    batches = batches_of(streams, partitions, settings.batch_size, skew,
                         tuple(model.input_names))  # fmt: skip
    run = replay(batches, model, table, settings.history_events, settings.resend_window())
    report = backtest_report(run, ruleset, model)
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0


def backtest_report(run: Replayed, ruleset: RuleSet, model) -> dict:
    """The actions and the per-rule figures, as `--json` prints them."""
    label = label_type_of(model.model)
    gap_ms = model.model.meta.session_gap_seconds * 1000.0
    fired = [(a.user_id, a.rule, a.ts, e) for a, e in zip(run.actions, run.action_events,
                                                            strict=True)]  # fmt: skip
    figures = rule_report(run.users, run.types, np.asarray(run.ts, np.int64), fired, label,
                          int(gap_ms), [r.name for r in ruleset.rules])  # fmt: skip
    return {
        "model": model.version,
        "events": len(run.users),
        "label_type": label,
        "actions": [action_record(a, model.version) for a in run.actions],
        "rules": {f.rule: dataclasses.asdict(f) for f in figures},
    }


def render(report: dict) -> str:
    """The report as text: the actions, then one line per rule."""
    lines = [f"{len(report['actions'])} action(s) over {report['events']} events, "
             f"model {report['model']}"]  # fmt: skip
    for a in report["actions"]:
        why = ", ".join(f"{r['type']} {r['delta']:+.3f}" for r in a["reasons"])
        lines.append(f"  {iso_time(a['ts'])}  {a['rule']:<16} {a['user_id']:<20} "
                     f"score {a['score']:.3f}  {why}")  # fmt: skip
    lines.append("")
    lines.append(f"{'rule':<16} {'actions':>8} {'per day':>8} {'precision':>9} {'recall':>7} "
                 f"{'lead (median)':>14}")  # fmt: skip
    for name, f in report["rules"].items():
        lead, per_day = f.get("median_lead_seconds"), f.get("actions_per_day")
        lines.append(
            f"{name:<16} {f['actions']:>8} {'-' if per_day is None else f'{per_day:.1f}':>8} "
            f"{_share(f.get('precision')):>9} {_share(f.get('recall')):>7} "
            f"{'-' if lead is None else f'{lead:.0f} s':>14}"
        )
    return "\n".join(lines)


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
