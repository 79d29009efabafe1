"""`intentstream model evaluate`: registered versions (or files) side by side on live data.

The retained history (or JSON-lines files) is cut into sessions and labelled by the training
rules (docs/contract.md, Training data and labels: the model's label type, inputs stop
before the label, sessions split where a gap exceeds the model's session gap), each model
with its own vocabulary (unknown types take the reserved row) and features, and scored from a
zero state per session: what the worker computes (calibrated, when the model's meta holds a
calibration). ROC AUC, log loss, calibration error (ECE) and Brier score at the last step of
each session and over all steps: the same figures `intentstream train` reports on its
validation users; `--reliability FILE.png` draws the versions' reliability diagrams.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from model.artifact import DEFAULT_LABEL_TYPE, Model, label_type_of, load_model
from model.calibration import calibration_of
from model.training.evaluate import metrics_of, model_step_scores
from model.training.sessions import sessionize
from worker.lifecycle.registry import Registry

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_ms(text: str | None, now: float | None = None) -> int | None:
    """Epoch ms of `--since` (e.g. 90m, 24h, 7d), or None for all history."""
    if text is None:
        return None
    match = _SINCE.match(text.strip())
    if not match:
        raise ValueError(f"--since {text!r}: use a number and a unit s, m, h or d (e.g. 24h)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    return int(((now if now is not None else time.time()) - seconds) * 1000)


def left_out_line(since: str, events: list[dict], recent: list[dict], model: Model,
                  default_label: str) -> str:  # fmt: skip
    """What `--since` kept, in events and in sessions (cut by the model's rules)."""

    def sessions(evs: list[dict]) -> int:
        meta = model.meta
        return len(sessionize(evs, meta.event_types, meta.features, meta.session_gap_seconds,
                              label_type_of(model, default_label)))  # fmt: skip

    total, kept = sessions(events), sessions(recent)
    return (f"--since {since}: {len(recent)} of {len(events)} events, {kept} of {total} "
            f"sessions ({total - kept} fewer: those before the cutoff are left out)")  # fmt: skip


METRICS = ("auc_last", "logloss_last", "ece_last", "brier_last",
           "auc_all", "logloss_all", "ece_all", "brier_all")  # fmt: skip


def evaluate_models(
    models: dict[str, Model],
    events: list[dict],
    default_label: str = DEFAULT_LABEL_TYPE,
    scores: dict[str, tuple] | None = None,
) -> dict[str, dict]:
    """Per model name: its metrics on the events, with the sessions and labels behind them.
    With `scores` (a dict), each model's step scores are also kept there, with its raw
    head's when it is calibrated: (scores, raw scores or None)."""
    out = {}
    for name, model in models.items():
        label = label_type_of(model, default_label)
        sessions = sessionize(events, model.meta.event_types, model.meta.features,
                              model.meta.session_gap_seconds, label, model.inputs)  # fmt: skip
        positives = int(sum(s.label for s in sessions))
        calibrated = calibration_of(model.meta.model_extra) is not None
        if 0 < positives < len(sessions):
            step = model_step_scores(model, sessions)
            metrics = metrics_of(*step)
            if scores is not None:
                raw = model_step_scores(model, sessions, raw=True) if calibrated else None
                scores[name] = (step, raw)
        else:
            metrics = {k: float("nan") for k in METRICS}
        out[name] = metrics | {
            "label_type": label,
            "sessions": len(sessions),
            "positive_sessions": positives,
            "calibrated": calibrated,
        }
    return out


def write_reliability(path: str, scores: dict[str, tuple]) -> None:
    """A PNG of two reliability diagrams (each session's last step; all steps), a curve per
    model as it scores and, faintly, its raw head's when it is calibrated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from model.reliability_plot import Curve, draw_reliability

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, (y, p, where) in zip(axes, ((2, 3, "each session's last step"), (0, 1, "all steps")),
                                 strict=True):  # fmt: skip
        curves = []
        for i, (name, (step, raw)) in enumerate(scores.items()):
            color = f"C{i % 10}"
            curves.append(Curve(name, step[y], step[p], color))
            if raw is not None:
                curves.append(Curve(f"{name} raw", raw[y], raw[p], color, faint=True))
        draw_reliability(ax, curves, f"Reliability at {where}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load_named_models(registry: Registry | None, names: list[str]) -> dict[str, Model]:
    """Each name is a registry version, or a path to an artifact file."""
    models = {}
    for name in names:
        if Path(name).suffix == ".npz" or (registry is None or not name.isdigit()):
            models[name] = load_model(name)
        else:
            models[name] = registry.load(name)
    return models


def judge_held_out(models: dict[str, Model], events: list[dict]) -> dict[str, dict | None]:
    """Per model: the model and the baselines on the test users its training held out of
    these events (model/judging/), or None when it held none out (or they are one class)."""
    from model.judging.protocol import held_out_of, judge_model
    from model.judging.report import heldout_report

    out: dict[str, dict | None] = {}
    for name, model in models.items():
        split = held_out_of(model, events)
        judged = judge_model(model, events, *split) if split else None
        out[name] = heldout_report(judged) if judged is not None else None
    return out


def print_held_out(judged: dict[str, dict | None]) -> None:
    from model.judging.report import heldout_lines

    for name, test in judged.items():
        if test is None:
            print(f"\n{name}: no held-out users in these events (trained without test users, "
                  "or they hold a single class)")  # fmt: skip
        else:
            title, *table = heldout_lines(test)
            print("\n".join([f"\n{name}: {title.strip()}", *table]))


def print_table(results: dict[str, dict]) -> None:
    widths = [len(k) + 1 for k in METRICS]
    print(f"{'model':<12} {'sessions':>9} {'positive':>9}"
          + "".join(f" {k:>{w}}" for k, w in zip(METRICS, widths, strict=True)))  # fmt: skip
    for name, r in results.items():
        values = "".join(
            f" {r.get(k, float('nan')):>{w}.4f}" for k, w in zip(METRICS, widths, strict=True)
        )
        print(f"{name:<12} {r['sessions']:>9} {r['positive_sessions']:>9}{values}")


def push(url: str, results: dict[str, dict]) -> None:
    """Push each model's metrics to a Prometheus Pushgateway (job intentstream_evaluate):
    intentstream_evaluate_<metric>{model="<name>"}, one gauge per metric of METRICS and the
    session counts."""
    reg = CollectorRegistry()
    gauges = {
        k: Gauge(f"intentstream_evaluate_{k}", f"model evaluate: {k}", ["model"], registry=reg)
        for k in (*METRICS, "sessions", "positive_sessions")
    }
    for name, r in results.items():
        for k, g in gauges.items():
            if k in r:
                g.labels(name).set(r[k])
    push_to_gateway(url, job="intentstream_evaluate", registry=reg)


def run_evaluate(
    args: argparse.Namespace,
    events: list[dict],
    registry: Registry | None,
    cutoff_ms: int | None = None,
) -> int:
    """Evaluate args.versions on the events (those at or after cutoff_ms, saying how many
    sessions that leaves out); print a table or JSON; push if asked."""
    reliability = getattr(args, "reliability", None)
    if reliability:
        try:
            import matplotlib  # noqa: F401 - checked before the scoring, not after
        except ImportError:
            print("error: --reliability needs matplotlib: pip install 'intentstream[train]'",
                  file=sys.stderr)  # fmt: skip
            return 2
    models = load_named_models(registry, args.versions)
    if cutoff_ms is not None:
        recent = [e for e in events if e["ts"] >= cutoff_ms]
        print(left_out_line(args.since, events, recent, next(iter(models.values())),
                            args.label_type), file=sys.stderr)  # fmt: skip
        events = recent
    scores: dict[str, tuple] = {}
    results = evaluate_models(models, events, args.label_type, scores)
    if getattr(args, "held_out", False):
        judged = judge_held_out(models, events)
        for name, test in judged.items():
            results[name]["held_out"] = test
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True, default=float))
    else:
        print_table(results)
        if getattr(args, "held_out", False):
            print_held_out(judged)
    if reliability:
        if scores:
            write_reliability(reliability, scores)
            print(f"wrote {reliability}", file=sys.stderr)
        else:
            print(f"warning: {reliability} not written: no model has sessions of both classes",
                  file=sys.stderr)  # fmt: skip
    if args.pushgateway:
        try:
            push(args.pushgateway, results)
        except OSError as exc:
            print(f"warning: could not push metrics to {args.pushgateway}: {exc}", file=sys.stderr)
    return 0
