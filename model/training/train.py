"""Offline training: sessions → truncated BPTT with clipping → evaluated artifact
(docs/contract.md, Training data and labels).

    result = train(events, TrainConfig(hidden=64, epochs=10))
    save_model(result.model, "model.npz")

The settings are model/training/config.py's; the events become sessions split by user
(validation_fraction) in model/training/prepare.py. The RNN and a bag-of-event-types baseline
are fitted on the training users and compared on the validation users. After every epoch the
validation loss is measured; the artifact holds the epoch with the lowest one, training stops
after `patience` epochs without improvement or when a loss stops being finite, so a diverged
epoch never ships. With `weight_average`, what each epoch is judged on, and what is kept, is a
moving average of the steps' weights. Same seed and data give bit-identical weights.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from threadpoolctl import threadpool_limits

from model.artifact import Model, ModelMeta, statistics_rows, validate_model
from model.calibration import reliability_record
from model.ensemble import folded
from model.inputs import table_columns
from model.params import Params, pack, unpack
from model.random_init import random_model
from model.training.bptt import clip_global_norm, packed_loss_and_gradients
from model.training.calibration_fit import calibrated_on_validation
from model.training.config import TrainConfig, declarations_of
from model.training.evaluate import evaluate_model, metrics_of, roc_curve, step_scores
from model.training.optim import make_optimizer
from model.training.prepare import DATA_FIELDS, Prepared, prepare_training
from model.training.sessions import (
    DataError,
    Session,
    minibatches,
    pad,
    sessionize,
    split_by_user,
)
from model.training.wide_fit import with_wide_part


@dataclass
class TrainResult:
    """The trained model and everything the report holds."""

    model: Model
    report: dict
    validation_sessions: list[Session] = field(default_factory=list)
    curves: dict = field(default_factory=dict)
    # the held-out test users' events (config.test_fraction), which training never read
    test_events: list[dict] = field(default_factory=list)


def _summary(events: list[dict], train: list[Session], valid: list[Session], known: set[str]):
    types = Counter(e["type"] for e in events)
    return {
        "events": len(events),
        "users": len({e["user_id"] for e in events}),
        "train_sessions": len(train),
        "validation_sessions": len(valid),
        "train_positive_rate": float(np.mean([s.label for s in train])) if train else 0.0,
        "validation_positive_rate": float(np.mean([s.label for s in valid])) if valid else 0.0,
        "train_steps": int(sum(len(s.types) for s in train)),
        "unknown_type_events": int(sum(n for t, n in types.items() if t not in known)),
        "left_out_types": dict([(t, n) for t, n in types.most_common() if t not in known][:100]),
        "event_types": dict(types.most_common()),
    }


class TrainingDivergedError(DataError):
    """No epoch ended with a finite loss: nothing worth writing."""


@dataclass
class BestEpoch:
    """The epoch with the lowest finite validation loss so far, and why training stopped."""

    patience: int = 3
    epoch: int = 0
    validation_loss: float = float("inf")
    params: Params | None = None
    since: int = 0  # epochs since it
    stopped: str = "epochs"

    def update(self, epoch: int, train_loss: float, valid_loss: float, params: Params) -> bool:
        """Record an epoch; return True when training should stop."""
        if not (np.isfinite(train_loss) and np.isfinite(valid_loss)):
            self.stopped = "diverged"
            return True
        if valid_loss < self.validation_loss:
            self.epoch, self.validation_loss, self.since = epoch, valid_loss, 0
            self.params = params.copy()
            return False
        self.since += 1
        if self.since >= self.patience:
            self.stopped = "patience"
            return True
        return False

    def reason(self, epochs_run: int) -> str:
        """One line: which epoch the artifact holds and why."""
        kept = (
            f"kept epoch {self.epoch} of {epochs_run} "
            f"(lowest validation loss {self.validation_loss:.4f})"
        )
        if self.stopped == "diverged":
            return f"{kept}; stopped: the loss of epoch {epochs_run} is not finite (diverged)"
        if self.stopped == "patience":
            return f"{kept}; stopped after {self.since} epoch(s) without a lower validation loss"
        return kept


def decay_tables(params: Params, rate: float) -> None:
    """Shrink the input tables toward zero by `rate` (in place); no tables, no change."""
    if rate and params.tab.size:
        np.multiply(params.tab, params.tab.dtype.type(1.0 - rate), out=params.tab)


def moved_towards(average: Params, params: Params, rate: float) -> None:
    """Move each of `average`'s arrays towards `params`' by `rate`, in place (a step of an
    exponential moving average)."""
    for a, p in zip(average.arrays().values(), params.arrays().values(), strict=True):
        a += rate * (p - a)


def _validation_loss(params: Params, batches: list, bptt: int) -> float:
    total = sum(packed_loss_and_gradients(params, b, bptt)[0] * b.steps for b in batches)
    return float(total / sum(b.steps for b in batches))


def train(
    events: Iterable[dict] | Prepared,
    config: TrainConfig,
    progress: Callable[[int, int], object] | None = None,
    init: Model | None = None,
    state_space: str | None = None,
) -> TrainResult:
    """Train an RNN on events (dicts: user_id, type, ts); evaluate it beside the baseline.

    `events` may be prepare_training's result for a config that agrees with this one on
    DATA_FIELDS (ValueError otherwise; not with `init`). progress, when given, is a tqdm-like
    factory: progress(total=..., desc=...) returning an
    object with update(n) and set_postfix(**kw), used once per epoch. With `init`, training
    starts from that model's weights and keeps its architecture, vocabulary, features and
    session gap (fine-tuning); `state_space` is then recorded in the meta: the new model
    continues the parent's hidden states (docs/contract.md, Model artifacts and the registry).
    """
    if init is not None:
        if isinstance(events, Prepared):
            raise ValueError("fine-tuning (init) prepares its own data")
        m = init.meta
        if config.ensemble > 1:
            raise DataError("--ensemble trains new models; fine-tuning (--init-from) takes 1")
        if m.head != "sigmoid":
            raise DataError("--init-from needs a model with a sigmoid head (training fits one)")
        config = config.model_copy(update={
            "cell": m.cell, "hidden": m.hidden, "layers": m.layers,
            "embedding_dim": init.embedding_dim, "features": list(m.features),
            "session_gap_seconds": m.session_gap_seconds, "event_types": list(m.event_types),
            "inputs": declarations_of(init.inputs), "wide_head": m.wide_head,
        })  # fmt: skip
    # Mini-batch products are small: one BLAS thread is as fast on a quiet machine, and
    # OpenBLAS's thread hand-offs cost milliseconds per product on a busy one.
    with threadpool_limits(limits=1, user_api="blas"):
        if isinstance(events, Prepared):
            data = events
            if config.model_dump(include=DATA_FIELDS) != data.asked.model_dump(include=DATA_FIELDS):
                raise ValueError("the prepared data were made for another data config")
        else:
            data = prepare_training(events, config, init)
        return _train(data, config, progress, init, state_space)


def _fresh_model(types: list[str], config: TrainConfig, inputs, member: int) -> Model:
    """A seeded random model to train (member k of an ensemble: seed + k)."""
    return random_model(
        types, config.hidden, config.layers, config.features, config.embedding_dim,
        "sigmoid", config.session_gap_seconds, config.seed + member, cell=config.cell,
        inputs=inputs, wide_head=config.wide_head,
    )  # fmt: skip


def _widened(sessions: list[Session], F: int, inputs, K: int) -> list[Session]:
    """The sessions as a fold of K members reads them: each table's columns K times as wide
    (zeros: the forward pass fills them from the tables)."""
    at = [F + col + dim for col, dim in table_columns(inputs or []) for _ in range((K - 1) * dim)]
    if not at:
        return sessions
    return [replace(s, features=np.insert(s.features, at, 0.0, axis=1)) for s in sessions]


def _fit_member(
    model: Model, config: TrainConfig, train_s: list[Session], valid_s: list[Session],
    progress, seed: int, wide_after: bool,
) -> tuple[dict[str, np.ndarray], BestEpoch, list[dict]]:  # fmt: skip
    """One model trained by BPTT with early stopping: (the kept epoch's arrays, how that
    epoch was chosen, the epochs' history)."""
    F = len(config.features)
    inputs = model.inputs
    # copies: pack keeps some arrays as they are, and fine-tuning must not move its parent's
    params = pack({k: np.array(v) for k, v in model.arrays.items()}, config.cell, np.float32,
                  inputs)  # fmt: skip
    if wide_after:
        params.w_f[:] = 0.0
    # With a wide head the session statistics are the wide part's: layer 0 does not read them
    # (read by both, REES46's held-out users lost, docs/experiments.md)
    unread = params.E.shape[1] + statistics_rows(model.meta)
    unread = unread if model.meta.wide_head else unread[:0]
    params.W_x0[unread] = 0.0
    optimizer = make_optimizer(config.optimizer, config.lr)
    rng = np.random.default_rng(seed)
    valid_batch = [pad(valid_s[i : i + 512], F) for i in range(0, len(valid_s), 512)]
    history: list[dict] = []
    best = BestEpoch(patience=config.patience)
    average = params.copy() if config.weight_average else None
    for epoch in range(1, config.epochs + 1):
        t0 = time.time()
        batches = minibatches(train_s, config.batch_size, F, rng)
        desc = f"epoch {epoch}/{config.epochs}"
        bar = progress(total=len(batches), desc=desc, unit="batch") if progress else None
        total, steps, norms, seen = 0.0, 0, [], 0
        for batch in batches:
            loss, grads = packed_loss_and_gradients(params, batch, config.bptt)
            if wide_after:
                grads.w_f[:] = 0.0
            grads.W_x0[unread] = 0.0
            norms.append(clip_global_norm(grads.arrays(), config.clip))
            optimizer.step(params.arrays(), grads.arrays())
            decay_tables(params, config.lr * config.input_weight_decay)
            if average is not None:
                moved_towards(average, params, 1.0 - config.weight_average)
            total += loss * batch.steps
            steps += batch.steps
            seen += len(batch.labels)
            if bar is not None:
                bar.update(1)
                rate = seen / max(1e-9, time.time() - t0)
                bar.set_postfix(loss=f"{total / steps:.4f}", sessions_per_s=f"{rate:.0f}")
        if bar is not None:
            bar.close()
        judged = average if average is not None else params
        valid_loss = _validation_loss(judged, valid_batch, config.bptt)
        history.append({
            "epoch": epoch,
            "train_loss": total / steps,
            "validation_loss": valid_loss,
            "seconds": time.time() - t0,
            "sequences_per_second": len(train_s) / max(1e-9, time.time() - t0),
            "grad_norm_median": float(np.median(norms)),
        })  # fmt: skip
        if best.update(epoch, total / steps, valid_loss, judged):
            break
    if best.params is None:
        raise TrainingDivergedError(
            "training diverged in epoch 1 (the loss is not finite); lower --lr or --clip"
        )
    return {k: np.array(v) for k, v in unpack(best.params, inputs).items()}, best, history


def _train(
    data: Prepared, config: TrainConfig, progress, init: Model | None, state_space
) -> TrainResult:
    started = time.time()
    events, held, test_events, inputs = data.events, data.held, data.test_events, data.inputs
    types, train_s, valid_s, base_scores = data.types, data.train_s, data.valid_s, data.base_scores
    config = config.model_copy(update={"features": data.config.features})
    F = len(config.features)
    # A fresh wide head's wide part is fitted after the deep part (model/training/wide_fit.py);
    # fine-tuning (init) trains both jointly from the parent's weights.
    wide_after = config.wide_head and init is None
    starts = [init] if init is not None else [
        _fresh_model(types, config, inputs, k) for k in range(config.ensemble)]  # fmt: skip
    runs = [_fit_member(m, config, train_s, valid_s, progress, config.seed + k, wide_after)
            for k, m in enumerate(starts)]  # fmt: skip
    model = starts[0]
    kept, best, history = runs[0]
    if len(runs) > 1:  # the members side by side: one model, their mean logit
        model = folded([validate_model(m.meta, arrays) for m, (arrays, _, _) in
                        zip(starts, runs, strict=True)])  # fmt: skip
        kept = {k: np.array(v) for k, v in model.arrays.items()}
        train_s, valid_s = (_widened(s, F, inputs, len(runs)) for s in (train_s, valid_s))
    inputs = model.inputs
    wide = None
    if wide_after:
        kept, wide = with_wide_part(kept, pack(kept, config.cell, np.float64, inputs), train_s,
                                    valid_s, F)  # fmt: skip
    raw_scores = step_scores(pack(kept, config.cell, np.float64, inputs), valid_s, F)
    calibration, rnn_scores, calibration_note = None, raw_scores, "not asked (--no-calibrate)"
    if config.calibrate:
        calibration, rnn_scores, calibration_note = calibrated_on_validation(
            pack(kept, config.cell, np.float64, inputs), valid_s, F, raw_scores,
            config.calibration_min_sessions, config.calibration_fallback,
        )  # fmt: skip
    # AUCs of the raw scores: the map is monotone, so they are the calibrated model's too
    # (the cross-fitted scores mix two maps); the rest of the calibrated scores out of fold
    metrics = metrics_of(*rnn_scores) | {
        k: v for k, v in metrics_of(*raw_scores).items() if k.startswith("auc")
    }
    base_metrics = metrics_of(*base_scores)
    data = _summary(events, train_s, valid_s, set(types)) | {
        "test_users": len(held), "test_events": len(test_events)}  # fmt: skip
    kept_epoch = {
        **(
            {
                "members": [
                    {"epoch": b.epoch, "epochs_run": len(h), "validation_loss": b.validation_loss}
                    for _, b, h in runs
                ]
            }
            if len(runs) > 1
            else {}
        ),
        "epoch": best.epoch,
        "validation_loss": best.validation_loss,
        "epochs_run": len(history),
        "stopped": best.stopped,
        "reason": best.reason(len(history))
        + (
            f"; an ensemble of {len(runs)} (kept epochs "
            f"{', '.join(str(b.epoch) for _, b, _ in runs)}) folded into one model of "
            f"{model.meta.hidden} units"
            if len(runs) > 1
            else ""
        ),
    }
    report = {
        "config": config.model_dump(),
        "inputs": [s.model_dump() for s in inputs],
        "data": data,
        "epochs": history,
        "kept_epoch": kept_epoch,
        "metrics": metrics,
        "metrics_raw": metrics_of(*raw_scores),
        "calibration": calibration.model_dump() if calibration is not None else None,
        "calibration_note": calibration_note,
        "wide_part": asdict(wide) | {"note": wide.note()} if wide is not None else None,
        "baseline": base_metrics,
        "seconds": time.time() - started,
    }
    inherited = {"version", "state_space", "metrics", "baseline_metrics", "kept_epoch", "data",
                 "calibration", "reliability"}  # fmt: skip
    meta = {k: v for k, v in model.meta.model_dump().items() if k not in inherited} | {
        "label_type": config.label_type,
        **({"state_space": state_space} if init is not None and state_space else {}),
        "created_at": time.time(),
        **({"calibration": calibration.model_dump()} if calibration is not None else {}),
        "metrics": metrics,
        # the validation users' scores over all steps, as the model reports them: the
        # diagram the console draws
        "reliability": reliability_record(rnn_scores[0], rnn_scores[1]),
        "baseline_metrics": base_metrics,
        "kept_epoch": {k: v for k, v in kept_epoch.items() if k != "reason"},
        "data": {k: v for k, v in data.items() if k != "event_types"},
        "train_config": config.model_dump(),
    }
    trained = validate_model(ModelMeta.model_validate(meta), kept)
    curves = {
        "rnn": roc_curve(rnn_scores[2], rnn_scores[3]),
        "baseline": roc_curve(base_scores[2], base_scores[3]),
    }
    return TrainResult(trained, report, valid_s, curves, test_events)


def evaluate_on(model: Model, events: list[dict], config: TrainConfig) -> dict[str, float]:
    """Another model's metrics on the same validation users (built with its vocabulary)."""
    sessions = sessionize(events, model.meta.event_types, model.meta.features,
                          model.meta.session_gap_seconds, config.label_type,
                          model.inputs)  # fmt: skip
    _, valid = split_by_user(sessions, config.validation_fraction, config.seed,
                             config.test_fraction)  # fmt: skip
    return evaluate_model(model, valid)
