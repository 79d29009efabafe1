"""Choosing hyper-parameters within a time budget (`intentstream train --search SECONDS`).

Candidates are tried in a fixed order, the given configuration first, each trained as
`train` trains (the same test, training and validation users), until the budget is spent; the
one with the lowest validation loss (the per-step log loss early stopping reads, on the
validation users) is kept. The test users never take part, so the report's test figures
judge the search too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from model.training.config import TrainConfig
from model.training.train import TrainResult, train

# Around the given configuration, the changes that mattered most on the shops measured
# (docs/models.md, Choosing hyper-parameters): the cell, the width, the tables' decay, a
# slower learning rate over more epochs.
CANDIDATES: tuple[dict, ...] = (
    {},
    {"cell": "gru"},
    {"hidden": 32},
    {"input_weight_decay": 10.0},
    {"hidden": 16},
    {"lr": 0.002, "epochs": 20},
    {"cell": "gru", "hidden": 32},
    {"input_weight_decay": 1.0},
    {"cell": "lstm", "hidden": 32},
)


def candidates(config: TrainConfig) -> list[TrainConfig]:
    """The configurations to try, in order, each once (a change the given one already has
    is not tried twice)."""
    out: list[TrainConfig] = []
    for changes in CANDIDATES:
        candidate = TrainConfig.model_validate(config.model_dump() | changes)
        if candidate not in out:
            out.append(candidate)
    return out


def searched(
    events: list[dict], config: TrainConfig, seconds: float,
    progress: Callable | None = None, log: Callable[[str], object] | None = None,
) -> TrainResult:  # fmt: skip
    """The best of the candidates trained within `seconds` (at least the given one), its
    report's `search` listing each candidate tried with its validation loss and AUC."""
    started = time.time()
    tried, best, todo = [], None, candidates(config)
    for candidate in todo:
        if tried and time.time() - started >= seconds:
            break
        t0 = time.time()
        result = train(events, candidate, progress)
        given = config.model_dump()
        changes = {k: v for k, v in candidate.model_dump().items() if given[k] != v}
        row = {"changes": changes,
               "validation_loss": result.report["kept_epoch"]["validation_loss"],
               "validation_auc_last": result.report["metrics_raw"]["auc_last"],
               "seconds": time.time() - t0}  # fmt: skip
        tried.append(row)
        if log is not None:
            log(f"search: {changes or 'as given'}: validation loss {row['validation_loss']:.4f}, "
                f"AUC last {row['validation_auc_last']:.4f} ({row['seconds']:.0f} s)")  # fmt: skip
        if best is None or row["validation_loss"] < best[0]:
            best = (row["validation_loss"], result, changes)
    assert best is not None
    _, result, changes = best
    result.report["search"] = {"seconds": seconds, "tried": tried, "chosen": changes,
                               "untried": len(todo) - len(tried)}  # fmt: skip
    return result
