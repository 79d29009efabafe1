"""The `intentstream explain USER` command: the events of a user's current session that moved
their score most, by leave-one-out replay of the state's `recent` field (model/explain.py)."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from model.artifact import file_version, load_model
from model.explain import Explanation, leave_one_out
from model.input_encoding import Stored
from model.scoring import ScoringModel
from worker.commands.registry_access import registry_of
from worker.common.connection import name_wrong_type
from worker.common.keys import partition_of
from worker.common.partition_count import recorded_partitions
from worker.common.settings import add_setting_flags, load_settings
from worker.engine.compute.actions import session_of
from worker.engine.compute.lean_state import as_fields
from worker.engine.compute.recent import Recent, form_of, unpack
from worker.lifecycle.registry import Registry, RegistryError

# Exit code when the user has no state or no kept events: nothing to explain. A user named
# that is not there is a mistake to fix, as an unknown rule, version or file (exit 2); exit 1
# is kept for runs that finished but skipped some input (docs/operators.md).
NOTHING_EXIT = 2
# Stored and replayed scores closer than this are the same score (float32 kernels, other waves).
SAME = 1e-5


def add_flags(ex: argparse.ArgumentParser) -> None:
    """The `explain` sub-command's flags (its parser and help: worker/commands/cli.py)."""
    ex.add_argument("user", metavar="USER", help="the user id")
    ex.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_setting_flags(ex, ["redis_url", "cluster", "prefix", "socket_timeout", "model"])
    ex.set_defaults(func=cmd_explain)


@dataclass(frozen=True)
class UserState:
    """What the explanation reads of a user's state hash."""

    partition: int
    partitions: int
    recent: Recent
    score: float  # NaN when absent
    model: str | None


def cmd_explain(args: argparse.Namespace) -> int:
    """The `intentstream explain` command; returns its exit code. Registry, Redis and artifact
    errors propagate: main() prints them as one line and exits 2."""
    registry = registry_of(args)
    state = read_state(registry, args.user)
    if state is None:
        return _nothing(f"no state for user {args.user!r} under prefix {registry.prefix!r}")
    if not len(state.recent):
        return _nothing(
            f"user {args.user!r} has no recent events kept (the workers' history-events is 0, "
            "or their state predates it): nothing to replay"
        )
    scoring = explaining_model(args, registry)
    (ex,) = leave_one_out(scoring, [session_of(state.recent, scoring)])
    report = explanation_report(args.user, state, scoring, ex)
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0


def _nothing(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return NOTHING_EXIT


def read_state(registry: Registry, user: str) -> UserState | None:
    """The user's state under the recorded partition count (1 before any worker), or None."""
    partitions = recorded_partitions(registry.r, registry.keys) or 1
    p = partition_of(user, partitions)
    key = registry.keys.state(p, user)
    try:
        fields = as_fields(registry.r.hgetall(key))  # either layout
    except redis.ResponseError as exc:
        name_wrong_type(registry.r, exc, {key: "hash"})
        raise
    if not fields:
        return None
    model = fields.get(b"model")
    return UserState(
        partition=p,
        partitions=partitions,
        recent=unpack(fields.get(b"recent")),
        score=_number(fields.get(b"score")),
        model=model.decode(errors="replace") if model is not None else None,
    )


def _number(raw: bytes | None) -> float:
    try:
        return float(raw) if raw is not None else math.nan
    except ValueError:
        return math.nan


def explaining_model(args: argparse.Namespace, registry: Registry) -> ScoringModel:
    """The --model file (as a worker pinned to it names it), else the registry's current."""
    settings = load_settings(args)
    if settings.model is not None:
        model = load_model(settings.model)
        return ScoringModel(model, version=file_version(model, settings.model))
    version = registry.current()
    if version is None:
        raise RegistryError("no current model in the registry (promote one, or give --model FILE)")
    return ScoringModel(registry.load(version, settings.max_model_bytes), version=version)


def history_complete(recent: Recent, scoring: ScoringModel) -> bool:
    """Whether the kept events start the session: no event before them, or a gap from it
    longer than the model's session gap (the state restarted from zero there too)."""
    if recent.prev_ts < 0:
        return True
    gap_s = scoring.model.meta.session_gap_seconds
    first = recent.ts[0]
    return gap_s > 0 and first > recent.prev_ts and (first - recent.prev_ts) / 1000.0 > gap_s


def unheld_inputs(recent: Recent, scoring: ScoringModel) -> list[str]:
    """The model's declared inputs the history does not hold (they replay as absent)."""
    held = set(recent.fields)
    return [s.name for s in scoring.inputs if (form_of(s), s.name) not in held]


def explanation_report(
    user: str, state: UserState, scoring: ScoringModel, ex: Explanation
) -> dict[str, object]:
    """The explanation as the JSON output shows it; the table renders the same."""
    rank = {r.position: k for k, r in enumerate(ex.top(), start=1)}
    session = ex.session
    kinds = {spec.name: spec.kind for spec in scoring.inputs}
    kept = {name: values for name, values in (session.inputs or {}).items() if name in kinds}
    events = [
        {
            "position": j + 1,
            "type": session.types[j],
            "ts": int(session.ts[j]),
            "time": iso_time(int(session.ts[j])),
            "score_without": float(ex.scores_without[j]),
            "delta": float(ex.deltas[j]),
            "reason": rank.get(j + 1),
        }
        for j in range(len(session))
    ]
    for j, event in enumerate(events if kept else []):  # the kept inputs' values
        event["inputs"] = {name: input_value(kinds[name], v, j) for name, v in kept.items()}
    complete = history_complete(state.recent, scoring)
    notes = []
    if state.model != scoring.version:
        notes.append(
            f"the stored score was computed by model {state.model or '(none)'}, "
            f"these replays use model {scoring.version}"
        )
    lacking = unheld_inputs(state.recent, scoring)
    if lacking:
        notes.append(
            f"the kept events do not hold the model's inputs {', '.join(lacking)} (the models "
            "that scored them did not declare them): they replay as missing"
        )
    if not complete:
        notes.append(
            "the kept events start inside the session (history-events bounds them): the "
            "replays start from a zero state, the user's state did not"
        )
    stored = None if math.isnan(state.score) else state.score
    return {
        "user_id": user,
        "partition": state.partition,
        "partitions": state.partitions,
        "state_model": state.model,
        "stored_score": stored,
        "model": scoring.version,
        "score_all": ex.score_all,
        "same_score": stored is not None and abs(stored - ex.score_all) <= SAME,
        "history_complete": complete,
        "inputs_missing": lacking,
        "prev_ts": session.prev_ts,
        "events": events,
        "reasons": [
            {"position": r.position, "type": r.type, "ts": r.ts, "delta": r.delta} for r in ex.top()
        ],
        "notes": notes,
    }


def input_value(kind: str, values: Sequence | Stored, j: int) -> object:
    """Event j's value of a declared input as the history keeps it: a numeric input's number
    (None when absent, "not a number" when it was one), a categorical or item input's
    32-bit hash (None when absent): the raw value is not kept."""
    v = values.values[j] if isinstance(values, Stored) else values[j]
    if kind == "numeric":
        number = float(v) if v is not None else math.nan
        return None if math.isnan(number) else "not a number" if math.isinf(number) else number
    return None if v is None or int(v) < 0 else {"hash": int(v)}


def iso_time(ts_ms: int) -> str | None:
    """An event time as ISO 8601 UTC with milliseconds; None for an event without one."""
    if ts_ms < 0:
        return None
    when = datetime.datetime.fromtimestamp(ts_ms / 1000.0, datetime.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shown_input(value: object) -> str:
    """An input's kept value in the table: the number, `bad` for one that was not a number,
    `#` and the hash in hex for a category or an item (the raw value is not kept), `-` for
    none."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return f"#{value['hash']:08x}"
    return "bad" if isinstance(value, str) else f"{value:.6g}"


def render(report: dict) -> str:
    """The table: a header, one row per event (its kept inputs' values, the reasons ranked
    1-3), then the notes."""
    stored = report["stored_score"]
    w = max([20, *(len(e["type"]) for e in report["events"])])  # the type column's width
    same = (
        "no stored score"
        if stored is None
        else "the stored score"
        if report["same_score"]
        else "differs from the stored score"
    )
    names = list(report["events"][0].get("inputs", {})) if report["events"] else []
    widths = {n: max(len(n), 10) for n in names}
    head = "".join(f" {n:>{widths[n]}}" for n in names)
    lines = [
        f"user {report['user_id']!r}  partition {report['partition']} of "
        f"{report['partitions']}  state of model {report['state_model'] or '(none)'}  "
        f"stored score {'(none)' if stored is None else f'{stored:.6f}'}",
        f"model {report['model']}: score with all {len(report['events'])} events "
        f"{report['score_all']:.6f} ({same})",
        "",
        f"{'#':>4}  {'type':<{w}} {'time (UTC)':<24}{head} {'without':>10} {'delta':>10}  reason",
    ]
    for e in report["events"]:
        mark = "" if e["reason"] is None else f"*{e['reason']}"
        values = "".join(f" {shown_input(e['inputs'][n]):>{widths[n]}}" for n in names)
        line = (
            f"{e['position']:>4}  {e['type']:<{w}} {e['time'] or '(no time)':<24}{values} "
            f"{e['score_without']:>10.6f} {e['delta']:>+10.6f}  {mark}"
        )
        lines.append(line.rstrip())
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
