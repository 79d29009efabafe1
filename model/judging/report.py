"""The judged figures as people read them: a table of the held-out users of one training run,
the Markdown table of K outer folds, and the reliability table by score quantile."""

from __future__ import annotations

import math

from model.judging.baselines import BOOSTED, LOGISTIC
from model.judging.protocol import (
    EARLY_STEPS,
    METRICS,
    MODEL,
    FoldResult,
    paired_bootstrap,
    reliability_by_quantile,
)

HEADERS = {"auc_last": "AUC last", "auc_all": "AUC all",
           **{f"auc_step{k}": f"AUC @{k}" for k in EARLY_STEPS},
           "ece_all": "ECE all", "ece_last": "ECE last"}  # fmt: skip


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def heldout_report(r: FoldResult) -> dict:
    """report.json's `test`: sizes, each scorer's metrics, and the model's AUC at the last
    event against each baseline with a 95% interval from resampling the test sessions."""
    paired = {}
    for name in (LOGISTIC, BOOSTED):
        if name in r.scores:
            d, lo, hi = paired_bootstrap(r.labels, r.scores[MODEL].last, r.scores[name].last)
            paired[name] = {"auc_last_difference": d, "interval": [lo, hi]}
    reliability = [{"mean_score": m, "observed": o, "steps": n}
                   for m, o, n in reliability_by_quantile([r])]  # fmt: skip
    return {
        "users": len(r.fold.test_users),
        "sessions": r.sessions,
        "positive_sessions": r.positive,
        "metrics": r.metrics,
        "paired": paired,
        "reliability": reliability,
    }


def heldout_lines(test: dict) -> list[str]:
    """The `train` command's table of its test users (heldout_report)."""
    lines = [f"\ntest users: {test['users']} users, {test['sessions']} sessions, "
             f"{test['positive_sessions']} buying (held out before every choice)"]  # fmt: skip
    width = max(len(n) for n in test["metrics"]) + 2
    lines.append(f"{'':<{width}}" + "".join(f"{HEADERS[m]:>10}" for m in METRICS))
    for name, m in test["metrics"].items():
        lines.append(f"{name:<{width}}" + "".join(f"{_fmt(m[k]):>10}" for k in METRICS))
    for name, p in test["paired"].items():
        lo, hi = p["interval"]
        lines.append(f"{MODEL} - {name}, AUC last: {p['auc_last_difference']:+.3f} "
                     f"(95% interval over resampled sessions {lo:+.3f} to {hi:+.3f})")  # fmt: skip
    return lines


def folds_table(summary: dict) -> str:
    """The Markdown table of K outer folds: each scorer's mean and 95% bootstrap interval over
    folds per metric, then the model's paired difference against the better baseline."""
    lines = ["| on held-out users | " + " | ".join(HEADERS[m] for m in METRICS) + " |",
             "| --- |" + " --- |" * len(METRICS)]  # fmt: skip
    for name, by_metric in summary["scorers"].items():
        cells = [f"{v['mean']:.3f} ({v['interval'][0]:.3f} to {v['interval'][1]:.3f})"
                 for v in (by_metric[m] for m in METRICS)]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for m in METRICS:
        p = summary["paired"][m]
        cells.append(f"{p['mean']:+.3f} ({p['interval'][0]:+.3f} to {p['interval'][1]:+.3f}) "
                     f"vs {p['against']}, better in {p['ahead']}/{p['of']}")  # fmt: skip
    lines.append(f"| {MODEL} minus the better baseline, per fold | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def reliability_table(results: list[FoldResult], name: str = MODEL) -> str:
    """Markdown: the scorer's held-out step scores by score decile, pooled over folds."""
    lines = ["| score decile | mean score | observed rate | steps |", "| --- | --- | --- | --- |"]
    for i, (m, o, n) in enumerate(reliability_by_quantile(results, name), start=1):
        lines.append(f"| {i} | {m:.3f} | {o:.3f} | {n} |")
    return "\n".join(lines)
