"""Reliability diagrams (docs/models.md, What a score means): per equal-width score bin, the
observed rate of positive sessions against the mean score, on the diagonal when a score means
what it says. Drawn by `intentstream train --report` (a panel of report.png) and
`intentstream model evaluate --reliability FILE.png`; matplotlib (the train extra) is imported
by the caller, so this module needs only an Axes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.calibration import expected_calibration_error, reliability


@dataclass(frozen=True)
class Curve:
    """One line of a diagram: labels and scores, how it is drawn."""

    label: str
    y: np.ndarray
    p: np.ndarray
    color: str = "C0"
    faint: bool = False  # the raw scores beside the calibrated ones
    dashed: bool = False


def draw_reliability(ax, curves: list[Curve], title: str) -> None:
    """The curves on one Axes: a point per non-empty bin, its area by the bin's share of the
    scores; the legend gives each curve's ECE."""
    ax.plot([0, 1], [0, 1], "k:", linewidth=0.8)
    for c in curves:
        mean_p, rate, count = reliability(c.y, c.p)
        keep = count > 0
        share = count[keep] / max(1.0, count.sum())
        ece = expected_calibration_error(c.y, c.p)
        ax.plot(mean_p[keep], rate[keep], "--" if c.dashed else "-", color=c.color,
                alpha=0.3 if c.faint else 1.0, linewidth=0.8 if c.faint else 1.5,
                label=f"{c.label} (ECE {ece:.3f})")  # fmt: skip
        ax.scatter(mean_p[keep], rate[keep], s=10 + 300 * share, color=c.color,
                   alpha=0.25 if c.faint else 0.8, edgecolors="none")  # fmt: skip
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="mean score in bin", ylabel="observed positive rate",
           title=title)  # fmt: skip
    ax.legend(loc="lower right", fontsize="small")
