"""The events made into training data: test users held out, the vocabulary, the declared
inputs fitted on the training users, sessions cut and split by user, the baseline scored."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from model.artifact import Model
from model.feature_names import expand_features, feature_help, unknown_features
from model.input_encoding import fitted_numeric
from model.inputs import Inputs, parse_inputs
from model.training.config import TrainConfig
from model.training.evaluate import BagOfTypes
from model.training.sessions import (
    DataError,
    Session,
    is_test_user,
    is_validation_user,
    sessionize,
    split_by_user,
)


def vocabulary(events: list[dict], config: TrainConfig) -> list[str]:
    """The event types of the model: given, or those seen at least `min_type_count` times in
    the data, most frequent first."""
    if config.event_types:
        return list(config.event_types)
    counts = Counter(e["type"] for e in events)
    kept = [t for t, n in counts.items() if n >= config.min_type_count]
    return sorted(kept, key=lambda t: (-counts[t], t))


def fit_inputs(events: list[dict], config: TrainConfig) -> Inputs | None:
    """The model's inputs (None without any): each numeric input standardised with the mean
    and scale of its values on the training users (fitted_numeric)."""
    if not config.inputs:
        return None
    train_events = [
        e for e in events
        if not is_validation_user(e["user_id"], config.validation_fraction, config.seed)
    ]  # fmt: skip
    specs: list[dict] = []
    for d in config.inputs:
        if d.kind == "numeric":
            values = [e.get(d.name) for e in train_events]
            specs.append(fitted_numeric(d.name, d.transform, values, d.session).model_dump())
        else:
            specs.append({"kind": d.kind, "name": d.name, "buckets": d.buckets, "dim": d.dim})
    try:
        return parse_inputs(specs)
    except ValueError as exc:
        raise DataError(str(exc)) from None


def with_features_of(config: TrainConfig, events: list[dict]) -> TrainConfig:
    """The config with `session` in its features expanded for the events' vocabulary; a
    DataError names a feature the vocabulary cannot give."""
    if not events:
        return config
    types = vocabulary(events, config)
    features = expand_features(config.features, types, config.label_type)
    unknown = unknown_features(features, types)
    if unknown:
        raise DataError(f"unknown features {unknown}; known: {feature_help()} "
                        f"(TYPE one of {', '.join(types)})")  # fmt: skip
    return config.model_copy(update={"features": features})


def prepare(events: list[dict], config: TrainConfig, inputs: Inputs | None = None):
    """Vocabulary and train/validation sessions (with the fitted `inputs`' columns);
    DataError when they cannot train a model."""
    if not events:
        raise DataError("no events to train on")
    types = vocabulary(events, config)
    sessions = sessionize(events, types, config.features, config.session_gap_seconds,
                          config.label_type, inputs)  # fmt: skip
    if not sessions:
        raise DataError("no sessions with inputs (every session starts with the label event)")
    labels = {s.label for s in sessions}
    if labels != {0.0, 1.0}:
        which = "positive" if labels == {1.0} else "negative"
        raise DataError(
            f"all {len(sessions)} sessions are {which} (label type {config.label_type!r}): "
            "a classifier needs both classes"
        )
    train, valid = split_by_user(sessions, config.validation_fraction, config.seed)
    if not train or not valid:
        raise DataError(
            f"too few users to split ({len(sessions)} sessions): "
            "need users on both sides of --validation-fraction"
        )
    if len({s.label for s in valid}) < 2:
        raise DataError("the validation users hold a single class; use more data")
    if not types:
        raise DataError(f"no event type occurs {config.min_type_count} times (--min-type-count)")
    return types, train, valid


@dataclass
class Prepared:
    """The events made into training data once: test users held out, inputs fitted, sessions
    split, the baseline fitted and scored. Trainings that differ only in the model (the cell,
    its size, the optimiser) can share it (model/benchmarks/long_range.py compares cells)."""

    asked: TrainConfig  # the config it was prepared for (DATA_FIELDS are what it read)
    config: TrainConfig  # the same, its features expanded for the vocabulary
    events: list[dict]
    held: set[str]
    test_events: list[dict]
    inputs: Inputs | None
    types: list[str]
    train_s: list[Session]
    valid_s: list[Session]
    base_scores: tuple  # BagOfTypes's step_scores on valid_s


# The config fields preparation reads: a Prepared serves any config that agrees on them.
DATA_FIELDS = {"event_types", "min_type_count", "features", "session_gap_seconds", "label_type",
               "validation_fraction", "test_fraction", "seed", "inputs"}  # fmt: skip


def prepare_training(
    events: Iterable[dict], config: TrainConfig, init: Model | None = None
) -> Prepared:
    """The events as training data for `config` (and `init`'s inputs when fine-tuning)."""
    events = list(events)
    # hashed once a user, not once an event (1 s of CPU on 500k events of 6,000 users)
    users = {e["user_id"] for e in events} if config.test_fraction else set()
    held = {u for u in users if is_test_user(u, config.test_fraction, config.seed)}
    test_events = [e for e in events if e["user_id"] in held]
    used = [e for e in events if e["user_id"] not in held] if held else events
    inputs = (init.inputs or None) if init is not None else fit_inputs(used, config)
    expanded = with_features_of(config, used)
    types, train_s, valid_s = prepare(used, expanded, inputs)
    base_scores = BagOfTypes(len(types) + 1).fit(train_s).step_scores(valid_s)
    return Prepared(config, expanded, events, held, test_events, inputs, types, train_s,
                    valid_s, base_scores)  # fmt: skip
