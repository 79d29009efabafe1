"""Inline SVG charts (no script, no library): bars of actions per day, and precision and
recall against the threshold with the rule's own threshold marked."""

from __future__ import annotations

import datetime
from html import escape

W, H, PAD = 420, 180, 32


def _frame(title: str, body: list[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="{PAD}" y="14" class="chart-title">{escape(title)}</text>'
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 8}" y2="{H - PAD}" stroke="#888"/>'
        f'<line x1="{PAD}" y1="24" x2="{PAD}" y2="{H - PAD}" stroke="#888"/>'
        + "".join(body)
        + "</svg>"
    )


def per_day_bars(per_day: list[tuple[int, int]]) -> str:
    """Actions per day (UTC) as bars, the busiest day's count on the axis."""
    if not per_day:
        return _frame("actions per day: none", [])
    top = max(n for _, n in per_day)
    width = (W - PAD - 16) / len(per_day)
    body = [f'<text x="2" y="30" class="chart-axis">{top}</text>']
    for i, (day_ms, n) in enumerate(per_day):
        h = (H - PAD - 28) * n / top
        x = PAD + 4 + i * width
        day = datetime.datetime.fromtimestamp(day_ms / 1000, datetime.timezone.utc)
        body.append(
            f'<rect x="{x:.1f}" y="{H - PAD - h:.1f}" width="{max(1.0, width - 4):.1f}" '
            f'height="{h:.1f}" fill="#3b7dd8"><title>{day:%Y-%m-%d}: {n}</title></rect>'
        )
        if len(per_day) <= 8:
            body.append(
                f'<text x="{x:.1f}" y="{H - PAD + 14}" class="chart-axis">{day:%m-%d}</text>'
            )
    return _frame("actions per day", body)


def _polyline(points: list[tuple[float, float | None]], colour: str) -> str:
    shown = [(x, y) for x, y in points if y is not None]
    coords = " ".join(f"{_x(x):.1f},{_y(y):.1f}" for x, y in shown)
    return f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"/>'


def _x(threshold: float) -> float:
    return PAD + (W - PAD - 16) * threshold


def _y(share: float) -> float:
    return H - PAD - (H - PAD - 28) * share


def threshold_curve(curve: list[tuple[float, float | None, float | None]], above: float) -> str:
    """Precision (orange) and recall (green) at each threshold; the rule's as a dashed line."""
    body = [
        '<text x="8" y="30" class="chart-axis">1</text>',
        f'<text x="8" y="{H - PAD}" class="chart-axis">0</text>',
        f'<text x="{PAD}" y="{H - PAD + 14}" class="chart-axis">0</text>',
        f'<text x="{W - 24}" y="{H - PAD + 14}" class="chart-axis">1</text>',
        _polyline([(t, p) for t, p, _ in curve], "#e07b00"),
        _polyline([(t, r) for t, _, r in curve], "#2a9d3c"),
        f'<line x1="{_x(above):.1f}" y1="24" x2="{_x(above):.1f}" y2="{H - PAD}" '
        'stroke="#444" stroke-dasharray="4 3"/>',
        f'<text x="{W - 150}" y="14" class="chart-precision">precision</text>',
        f'<text x="{W - 80}" y="14" class="chart-recall">recall</text>',
    ]
    return _frame("precision and recall by threshold", body)


def reliability_diagram(record: dict) -> str:
    """A model's reliability diagram (its meta's `reliability`): the observed buying rate
    against the mean score of each score bin, a dot per bin sized by its steps, and the
    diagonal a calibrated model follows."""
    try:  # the meta is read from Redis: numbers only, or nothing is drawn
        points = [(min(max(float(p), 0.0), 1.0), min(max(float(r), 0.0), 1.0), int(n))
                  for p, r, n in zip(record["mean_score"], record["observed"], record["count"],
                                     strict=True)]  # fmt: skip
    except (KeyError, TypeError, ValueError):
        points = []
    if not points:
        return _frame("reliability: not recorded", [])
    top = max(n for *_, n in points) or 1
    body = [
        '<text x="8" y="30" class="chart-axis">1</text>',
        f'<text x="8" y="{H - PAD}" class="chart-axis">0</text>',
        f'<text x="{W - 24}" y="{H - PAD + 14}" class="chart-axis">1</text>',
        f'<line x1="{_x(0):.1f}" y1="{_y(0):.1f}" x2="{_x(1):.1f}" y2="{_y(1):.1f}" '
        'stroke="#aaa" stroke-dasharray="4 3"/>',
        _polyline([(p, r) for p, r, _ in points], "#3b7dd8"),
    ]
    for p, r, n in points:
        radius = 2 + 4 * (n / top) ** 0.5
        body.append(
            f'<circle cx="{_x(p):.1f}" cy="{_y(r):.1f}" r="{radius:.1f}" fill="#3b7dd8">'
            f"<title>mean score {p:.3f}, observed {r:.3f}, {n} steps</title></circle>"
        )
    return _frame("reliability: observed rate against the score", body)
