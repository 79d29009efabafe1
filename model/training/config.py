"""A training run's settings: its hyper-parameters and the inputs it declares, validated at
the edge (the command line, a search, a benchmark) before any data is read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from model.artifact import DEFAULT_LABEL_TYPE
from model.inputs import Inputs


class InputDeclaration(BaseModel):
    """A declared input as training takes it (model/inputs.py): a numeric input's mean and
    scale are fitted on the training users; buckets and dim are a categorical or item
    input's, transform and session (its session statistics) a numeric one's."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["numeric", "categorical", "item"]
    name: str = Field(min_length=1, max_length=64)
    transform: Literal["log1p", "none"] = "none"
    session: bool = False
    buckets: int = Field(1024, ge=2, le=2**20)
    dim: int = Field(8, ge=1, le=64)


def declarations_of(inputs: Inputs) -> list[InputDeclaration]:
    """The declarations a fitted model's inputs were trained from."""
    return [
        InputDeclaration(kind="numeric", name=s.name, transform=s.transform, session=s.session)
        if s.kind == "numeric"
        else InputDeclaration(kind=s.kind, name=s.name, buckets=s.buckets, dim=s.dim)
        for s in inputs
    ]


class TrainConfig(BaseModel):
    """Hyper-parameters of a training run."""

    model_config = ConfigDict(extra="forbid")

    cell: Literal["rnn", "gru", "lstm"] = "rnn"
    hidden: int = Field(64, ge=1)
    layers: int = Field(1, ge=1)
    embedding_dim: int = Field(16, ge=1)
    features: list[str] = Field(default_factory=lambda: ["gap"])
    session_gap_seconds: float = Field(1800.0, ge=0)
    label_type: str = DEFAULT_LABEL_TYPE
    event_types: list[str] | None = None  # default: every type in the data, by frequency
    bptt: int = Field(35, ge=1)
    clip: float = Field(1.0, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(0.005, gt=0)
    batch_size: int = Field(64, ge=1)
    epochs: int = Field(10, ge=1)
    patience: int = Field(3, ge=1)  # epochs without a lower validation loss before stopping
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    # Users held out before anything is chosen (early stopping, calibration, inputs' scales):
    # the model is judged on them beside the baselines (model/judging/); 0 holds none out.
    test_fraction: float = Field(0.2, ge=0, lt=1)
    seed: int = 0
    # Types seen fewer times in the data take the unknown row: one stray XADD must not
    # become a vocabulary entry with an untrained embedding.
    min_type_count: int = Field(10, ge=1)
    # Fit the calibration map (model/calibration.py) on the validation users' scores, so a
    # score is a probability: 0.7 means about 70% of such sessions buy.
    calibrate: bool = True
    # Below this many validation sessions the map is not fitted: measured on
    # model/data/posterior.py, maps from a few hundred sessions made unseen users' scores worse.
    calibration_min_sessions: int = Field(1000, ge=2)
    # Below calibration_min_sessions: no map, or Platt scaling (two numbers) where, cross-
    # fitted, it lowers both the ECE and the log loss. Off by default: on the REES46 slice's
    # held-out users it left the mean ECE as it was and the worst fold's worse (BENCHMARKS.md).
    calibration_fallback: Literal["none", "platt"] = "none"
    # Declared inputs (model/inputs.py): fields of the events beyond type and ts; a model
    # with any is artifact format 2.
    inputs: list[InputDeclaration] = Field(default_factory=list)
    # A wide part beside the deep one: the head also reads x's numeric columns (features,
    # input values and flags) straight into the logit: a logistic regression on them, fitted
    # after the deep part and averaged with it (model/training/wide_fit.py).
    wide_head: bool = Field(
        False, description="the head also reads the features and the inputs' numeric "
        "columns directly (a wide part beside the recurrent one)",
    )  # fmt: skip
    # Members trained from seeds seed, seed + 1, ... on the same users and folded into one
    # model (model/ensemble.py): K times the state and the cell's work.
    ensemble: int = Field(
        1, ge=1, le=8, description="train this many models from different seeds on the same "
        "users and score their mean (one artifact, K times the hidden units)",
    )  # fmt: skip
    # Decoupled weight decay of the inputs' embedding tables only (each step multiplies them
    # by 1 - lr * decay): a rarely seen bucket's random N(0, 1) row fades instead of feeding
    # noise. 3 was chosen among 0, 1, 3, 10 on model/benchmarks/real_shop.py's two datasets, on
    # splits it does not report (BENCHMARKS.md, Real shop events); a model without tables is as
    # before.
    input_weight_decay: float = Field(
        3.0, ge=0, description="decoupled weight decay of the declared inputs' embedding "
        "tables (each step scales them by 1 - lr * this; 0: none)",
    )  # fmt: skip

    # The weights judged each epoch, and kept, are an exponential moving average of the
    # steps' (Polyak averaging): the last steps' noise averaged out. 0.98 (about the last 50
    # steps) raised REES46's held-out AUC over all steps in 8 of 8 seeds (+0.007), its AUC at
    # the last event level (BENCHMARKS.md, Real shop events); off by default.
    weight_average: float = Field(
        0.0, ge=0, lt=1, description="keep an exponential moving average of the weights, "
        "each step moving it by 1 - this (0.98: about the last 50 steps; 0: the last step's "
        "weights)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _decay_below_one(self) -> TrainConfig:
        tables = any(d.kind != "numeric" for d in self.inputs)
        if tables and self.lr * self.input_weight_decay >= 1:
            raise ValueError("lr * input_weight_decay must be below 1 (the tables' step factor)")
        return self
