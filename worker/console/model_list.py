"""The Models page: the registry's versions with the figures training recorded in their meta
(AUC at the last step, ECE, the reliability diagram), and promotion through the CLI's own
gate."""

from __future__ import annotations

import datetime

from worker.commands.models import promoted
from worker.console.chart import reliability_diagram
from worker.lifecycle.registry import Registry

# The figures shown per version, from the meta's `metrics` (train's validation users).
FIGURES = ("auc_last", "ece_all", "ece_last")


def version_rows(registry: Registry) -> list[dict]:
    """Every version, newest first: when published, its cell, figures, and whether current
    or shadow."""
    current, shadow = registry.current(), registry.shadow()
    rows = []
    for version in reversed(registry.versions()):
        meta = registry.meta(version)
        metrics = meta.get("metrics") or {}
        when = datetime.datetime.fromtimestamp(meta.get("published_at", 0), datetime.timezone.utc)
        rows.append({
            "version": version,
            "published": f"{when:%Y-%m-%d %H:%M:%S}",
            "cell": f"{meta.get('cell', 'rnn')} {meta.get('layers', '?')} x {meta.get('hidden')}",
            "figures": {k: metrics.get(k) for k in FIGURES},
            "reliability": reliability_diagram(meta.get("reliability") or {}),
            "current": version == current,
            "shadow": version == shadow,
        })  # fmt: skip
    return rows


def promote(registry: Registry, version: str) -> tuple[bool, list[str]]:
    """`model promote VERSION` without --force: (promoted, what the gate said)."""
    said: list[str] = []
    code = promoted(registry, version, False, say=said.append)
    return code == 0, said
