"""How far a benchmark's median over rounds could fall in another run on the same machine: on
a shared 2-vCPU VM one code's five-round median moved 1.14-1.33x from run to run, so a goal
read from one median needs its interval beside it."""

from __future__ import annotations

import numpy as np


def median_interval(values: list[float], draws: int = 10_000) -> tuple[float, float]:
    """The 5th and 95th percentiles of the median of `values` resampled with replacement: how
    far another run's median of as many rounds could fall on this machine."""
    rng = np.random.default_rng(0)
    picks = rng.choice(np.asarray(values, float), size=(draws, len(values)))
    low, high = np.percentile(np.median(picks, axis=1), [5, 95])
    return float(low), float(high)
