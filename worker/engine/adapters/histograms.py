"""Two Prometheus collectors the worker's metrics need beyond prometheus_client's: a histogram
fed whole arrays of observations, and one histogram's samples exported under a second name."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator

import numpy as np
from prometheus_client import Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Up to this many values a batch, BatchHistogram counts them one by one
FEW_VALUES = 8


class BatchHistogram(Collector):
    """A label-less histogram fed whole numpy arrays at a time."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = np.asarray(buckets, np.float64)
        self._bound_list = self.bounds.tolist()
        self._counts = np.zeros(len(buckets) + 1, np.int64)  # last: above the top bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: np.ndarray | list[float]) -> None:
        """Add every value of `values` to the histogram."""
        if isinstance(values, list) or values.size <= FEW_VALUES:
            if len(values):
                self._observe_few(values if isinstance(values, list) else values.tolist())
            return
        # le semantics: a value equal to a bound falls in that bound's bucket
        idx = np.searchsorted(self.bounds, values, side="left")
        counts = np.bincount(idx, minlength=self._counts.size)
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def _observe_few(self, values: list[float]) -> None:
        """observe_many's counts for a few values, a bisect each: numpy's calls cost ~10 µs
        a batch, most of its cost at low traffic (a batch of an event or two)."""
        top = len(self._bound_list)
        with self._lock:
            for v in values:
                # as searchsorted: le semantics, NaN above every bound
                self._counts[bisect_left(self._bound_list, v) if v == v else top] += 1
                self._sum += v

    def bucket_counts(self) -> np.ndarray:
        """A copy of the per-bucket (not cumulative) counts, the last one above the top."""
        with self._lock:
            return self._counts.copy()

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total_sum = self._sum
        buckets = [
            (repr(float(b)), int(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)
        ]
        buckets.append(("+Inf", int(cumulative[-1])))
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=total_sum
        )


class RenamedHistogram(Collector):
    """Another histogram's samples under another name: one set of observations exported
    twice, identical by construction (a metric renamed, its old name kept for queries)."""

    def __init__(self, name: str, documentation: str, source: Histogram) -> None:
        self.name = name
        self.documentation = documentation
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            renamed = Metric(self.name, self.documentation, family.type, family.unit)
            renamed.samples = [
                s._replace(name=self.name + s.name[len(family.name) :]) for s in family.samples
            ]
            yield renamed
