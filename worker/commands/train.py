"""The `intentstream train` command: events in (files or Redis), a model trained and
evaluated, a report written, the artifact published and promoted behind a quality gate."""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from model.artifact import file_version, load_model, save_model, state_space_of
from worker.commands.args import csv
from worker.commands.event_files import read_event_files
from worker.commands.input_flags import (
    absent_inputs_warning,
    describe_inputs,
    input_coverage,
    input_declarations,
)
from worker.commands.interrupts import held_interrupts
from worker.commands.registry_access import with_registry
from worker.common.connection import connect_settings
from worker.common.events import MIN_TS_MS
from worker.common.settings import load_settings
from worker.lifecycle.gate import comparison_line, refusals
from worker.lifecycle.history import read_history
from worker.lifecycle.registry import Registry
from worker.rules.definition import RuleError
from worker.rules.store import read_rules

# Flag help of each TrainConfig field; the flags, their types and defaults come from the
# fields themselves (see add_train_config_flags), so the defaults exist once, in TrainConfig.
TRAIN_HELP = {
    "hidden": "H, the state width per layer",
    "layers": "L, stacked recurrent layers",
    "embedding_dim": "D, the width of each event type's learned row",
    "features": "numeric features after the embedding row, comma-separated ('' for none); "
    "'session' adds the session's running counts, its length and the user's earlier "
    "sessions (docs/models.md, Session features)",
    "session_gap_seconds": "seconds; a longer gap starts a new session (0 = never split)",
    "label_type": "the event type that is the label ('will this session end in one')",
    "event_types": "the vocabulary, comma-separated (default: the types in the data seen at "
    "least --min-type-count times); others take the unknown row",
    "min_type_count": "types seen fewer times in the data take the unknown row (listed in "
    "the report)",
    "calibration_min_sessions": "fit the isotonic calibration map only on at least this "
    "many validation sessions (fewer: see --calibration-fallback)",
    "calibration_fallback": "below --calibration-min-sessions: none (the raw head's scores) "
    "or platt (Platt scaling, kept only if, cross-fitted, it lowers the ECE and the log loss)",
    "bptt": "truncation: steps gradients flow back",
    "clip": "global gradient norm bound",
    "optimizer": "the update rule",
    "lr": "learning rate",
    "batch_size": "sessions per mini-batch",
    "epochs": "at most this many passes over the training sessions",
    "patience": "stop after this many epochs without a lower validation loss; the artifact "
    "holds the epoch with the lowest",
    "cell": "rnn (Elman), gru or lstm (long sessions; see docs/models.md, Choosing a cell)",
    "validation_fraction": "fraction of the training users held out for validation (early "
    "stopping, calibration)",
    "test_fraction": "fraction of users held out before every choice, the model and the "
    "baselines judged on them (0: none)",
    "seed": "initialisation, split and shuffling",
    "calibrate": "fit the calibration map on the validation users, so a score is a probability "
    "(--no-calibrate: the head as trained)",
    "weight_average": "keep an exponential moving average of the weights, each step moving it "
    "by 1 - this (0.98: about the last 50 steps; 0: the last step's weights)",
}
# Fields whose flag is not `--field-name` (kept as the docs and users know them).
TRAIN_FLAG_NAMES = {"session_gap_seconds": "--session-gap"}


def _flag_type(annotation: object) -> dict:
    """argparse keywords (type, choices) for a TrainConfig field's annotation."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    if typing.get_origin(annotation) is list or any(typing.get_origin(a) is list for a in args):
        return {"type": csv, "metavar": "A,B,..."}
    if len(args) == 1:  # X | None
        return _flag_type(args[0])
    raise TypeError(f"no command-line type for {annotation!r}")


def add_train_config_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per TrainConfig field, with its default; a flag already defined is kept."""
    from model.training.config import TrainConfig

    for name, field in TrainConfig.model_fields.items():
        if name == "inputs":  # declared by add_input_flags
            continue
        flag = TRAIN_FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        if flag in parser._option_string_actions:
            continue
        default = field.get_default(call_default_factory=True)
        text = TRAIN_HELP.get(name) or field.description or ""
        kind = {"metavar": flag[2:].upper().replace("-", "_")} | _flag_type(field.annotation)
        parser.add_argument(flag, dest=name, default=default, help=text, **kind)


def train_config(args: argparse.Namespace):
    """The TrainConfig of the parsed flags (pydantic checks the values)."""
    from model.training.config import TrainConfig

    given = vars(args)
    fields = {k: given[k] for k in TrainConfig.model_fields if k in given and k != "inputs"}
    if "numeric" in given:  # the input flags (add_input_flags)
        fields["inputs"] = input_declarations(args)
    return TrainConfig(**fields)


def read_training_events(args: argparse.Namespace, settings) -> list[dict]:
    """Events from --data files (bad lines reported and skipped) or from Redis."""
    if args.from_redis:
        client = connect_settings(settings)
        names = [d.get("name") for d in input_declarations(args)] if "numeric" in args else []
        events, skipped = read_history(
            client, settings.prefix, settings.partitions, max_skew_ms=settings.max_ts_skew_ms,
            fields=[n for n in names if isinstance(n, str)],
        )  # fmt: skip
        if skipped:
            print(f"skipped {skipped} unparseable stream entries", file=sys.stderr)
        return events
    return read_event_files(args.data, args.format, args.columns)


def seconds_warning(events: list[dict]) -> str | None:
    """A warning when most of the events' times are before 2000 as epoch milliseconds: epoch
    seconds, most likely, which would shrink every gap (and the session cut) a thousandfold
    against what the worker later sees; None otherwise."""
    times = [e["ts"] for e in events if e.get("ts") is not None]
    early = sum(t < MIN_TS_MS for t in times)
    if not times or early * 2 <= len(times):
        return None
    return (f"warning: {early} of {len(times)} events' ts are before 2000-01-01 as epoch "
            "milliseconds: seconds? ts is epoch milliseconds, as the worker reads it")  # fmt: skip


METRIC_COLUMNS = (
    ("AUC last", "auc_last"), ("AUC all", "auc_all"), ("logloss last", "logloss_last"),
    ("logloss all", "logloss_all"), ("ECE last", "ece_last"), ("ECE all", "ece_all"),
    ("Brier last", "brier_last"), ("Brier all", "brier_all"),
)  # fmt: skip


def _print_metrics(report: dict) -> None:
    """The validation metrics table: the model as it scores (calibrated, its calibration
    measured cross-fitted), its raw head when calibrated, and the baseline."""
    widths = [max(len(h), 6) for h, _ in METRIC_COLUMNS]
    print(f"\n{'validation users':<24}" + "".join(
        f" {h:>{w}}" for (h, _), w in zip(METRIC_COLUMNS, widths, strict=True)))  # fmt: skip
    rows = [("rnn", report["metrics"])]
    if report.get("calibration") is not None and report.get("metrics_raw"):
        rows.append(("rnn, raw head", report["metrics_raw"]))
    rows.append(("bag-of-types baseline", report["baseline"]))
    for name, m in rows:
        values = "".join(
            f" {m.get(k, float('nan')):>{w}.4f}"
            for (_, k), w in zip(METRIC_COLUMNS, widths, strict=True)
        )
        print(f"{name:<24}{values}")
    if report.get("calibration_note"):
        print(f"calibration: {report['calibration_note']}")
    if report.get("calibration") is not None:
        print("(fitted on the validation users; its ECE and Brier above are cross-fitted)")
    if report.get("wide_part"):
        print(report["wide_part"]["note"])


def _print_left_out(report: dict, min_count: int) -> None:
    left_out = report["data"].get("left_out_types") or {}
    if left_out:
        shown = ", ".join(f"{t} ({n})" for t, n in list(left_out.items())[:10])
        more = f" and {len(left_out) - 10} more" if len(left_out) > 10 else ""
        print(f"\nleft out of the vocabulary (fewer than {min_count} events, or not in "
              f"--event-types; scored with the unknown row): {shown}{more}")  # fmt: skip


def _push_metrics(url: str, report: dict) -> None:
    reg = CollectorRegistry()
    m, data = report["metrics"], report["data"]
    values = {
        "intentstream_train_duration_seconds": ("Training run wall time.", report["seconds"]),
        "intentstream_train_validation_auc": ("Validation AUC, last step.", m["auc_last"]),
        "intentstream_train_validation_logloss": (
            "Validation log loss, last step.",
            m["logloss_last"],
        ),
        "intentstream_train_validation_ece": (
            "Validation expected calibration error, last step.",
            m["ece_last"],
        ),
        "intentstream_train_validation_ece_all_steps": (
            "Validation expected calibration error, all steps.",
            m["ece_all"],
        ),
        "intentstream_train_validation_brier": (
            "Validation Brier score, last step.",
            m["brier_last"],
        ),
        "intentstream_train_sessions": ("Training sessions.", data["train_sessions"]),
        "intentstream_train_events": ("Events read.", data["events"]),
    }
    for name, (doc, value) in values.items():
        Gauge(name, doc, registry=reg).set(value)
    push_to_gateway(url, job="intentstream_train", registry=reg)


def parent_model(name: str, settings) -> tuple:
    """The model --init-from names (an artifact file, else a registry version) and the state
    space its states belong to: its meta's `state_space`, else its version as the worker
    names it (a file's: file-<sha256 prefix>)."""
    if Path(name).is_file() or name.endswith(".npz") or "/" in name:  # a file, even a missing one
        model = load_model(name)
        return model, state_space_of(model.meta.model_extra or {}, file_version(model, name))
    registry = Registry(connect_settings(settings), settings.prefix)
    meta = registry.meta(name)
    return registry.load(name), state_space_of(meta, name)


class EpochLines:
    """The progress bar off a terminal: one line per epoch (a redrawn tqdm bar fills a log
    file: 84 KB for 8 epochs)."""

    def __init__(self, total: int, desc: str, unit: str = "batch") -> None:
        self.desc, self.total, self.unit, self.postfix = desc, total, unit, {}

    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **values: str) -> None:
        self.postfix = values

    def close(self) -> None:
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.total} {self.unit}es, {shown}", file=sys.stderr, flush=True)


def progress_factory(terminal: bool) -> Callable[..., object]:
    """tqdm's bar on a terminal (when installed), else one line per epoch."""
    if terminal:
        try:
            from tqdm import tqdm  # the train extra

            return tqdm
        except ImportError:
            print("(no progress bar: pip install 'intentstream[train]' for one)", file=sys.stderr)
    return EpochLines


def unwritable_directory(path: Path) -> str | None:
    """Why files cannot be written into the directory `path` (made if missing), or None."""
    if path.exists() and not path.is_dir():
        return "exists and is not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


def run_train(args: argparse.Namespace) -> int:
    """The `intentstream train` command; returns its exit code."""
    from model.training.report import write_report  # see add_train_config_flags
    from model.training.train import train

    if args.report:
        try:
            import matplotlib  # noqa: F401 - checked before hours of training, not after
        except ImportError:
            print("error: --report needs matplotlib: pip install 'intentstream[train]'",
                  file=sys.stderr)  # fmt: skip
            return 2
        problem = unwritable_directory(Path(args.report))
        if problem:
            print(f"error: --report {args.report}: {problem}", file=sys.stderr)
            return 2
    # Bad flags, data or an unreachable Redis raise; main() prints them as one line, exit 2.
    settings = load_settings(args, model=None)
    config = train_config(args)
    init, space = parent_model(args.init_from, settings) if args.init_from else (None, None)
    events = read_training_events(args, settings)
    warning = seconds_warning(events)
    if warning:
        print(warning, file=sys.stderr)
    names = [d.name for d in config.inputs]
    coverage = input_coverage(events, names) if names else None
    absent = absent_inputs_warning(coverage, events) if coverage else None
    if absent:  # a misspelt name or an unmapped column: refused before anything is written
        from model.training.sessions import DataError

        raise DataError(absent)
    folds = judged_folds(events, config, args.folds, args.search) if args.folds else None
    progress = None if args.quiet else progress_factory(sys.stderr.isatty())
    if args.search and init is None:
        from model.training.search import searched

        result = searched(events, config, args.search, progress, log=print)
        print(f"search: kept {result.report['search']['chosen'] or 'the configuration as given'}")
    else:
        result = train(events, config, progress=progress, init=init, state_space=space)
    if init is not None:
        print(f"fine-tuned from {args.init_from}: continues state space {space}")
    report = result.report
    print(report["kept_epoch"]["reason"])
    if len(result.model.inputs):
        print("inputs (numeric scales fitted on the training users):")
        print("\n".join(describe_inputs(result.model.inputs, coverage)))
    _print_metrics(report)
    report["test"] = judged_test(result, events, config)
    if folds is not None:
        report["folds"] = folds
    _print_left_out(report, config.min_type_count)
    if args.out:
        digest = save_model(result.model, args.out)
        print(f"wrote {args.out} (sha256 {digest[:16]})")
    if args.report:
        json_path, png_path = write_report(result, args.report)
        print(f"wrote {json_path} and {png_path}")
    if args.pushgateway:
        try:
            _push_metrics(args.pushgateway, report)
        except OSError as exc:
            print(f"warning: could not push metrics to {args.pushgateway}: {exc}", file=sys.stderr)
    if not (args.publish or args.promote):
        return 0

    def publish(reg: Registry) -> int:
        # Ctrl-C waits for the version, its gate and its promotion, then exits 130 saying so
        with held_interrupts() as interrupted:
            code = publish_and_promote(reg)
            if interrupted:
                print("Ctrl-C: held until the registry steps above were done; stopping now",
                      file=sys.stderr)  # fmt: skip
        return code

    def publish_and_promote(reg: Registry) -> int:
        version = reg.publish_model(result.model)
        print(f"published version {version}")
        if not args.promote:
            return 0
        refusals = gate(reg, result, events, config, force=args.force)
        for line in refusals:
            print(line)
        if refusals:
            return 1
        reg.promote(version)
        print(f"promoted version {version} to current")
        return 0

    return with_registry(args, publish)


def judged_test(result, events: list[dict], config) -> dict | None:
    """The model and the baselines on the run's test users, printed; report.json's `test`
    (None, with a line saying why, when there is nothing to judge on)."""
    from model.judging.baselines import MissingLibraryError
    from model.judging.protocol import judge_trained
    from model.judging.report import heldout_lines, heldout_report

    if not result.test_events:
        print("\ntest users: none held out (--test-fraction 0): no held-out figures")
        return None
    try:
        judged = judge_trained(result, events, config)
    except MissingLibraryError as exc:
        print(f"\ntest users: not judged: {exc}")
        return None
    if judged is None:
        print("\ntest users: they hold a single class: no held-out figures (use more data)")
        return None
    test = heldout_report(judged)
    print("\n".join(heldout_lines(test)))
    return test


def trainer_of(search: float):
    """How each fold trains: as `train`, or with `search` seconds of search (None: train)."""
    if not search:
        return None
    from model.training.search import searched

    return lambda events, config: searched(events, config, search).model


def judged_folds(events: list[dict], config, k: int, search: float = 0.0) -> dict:
    """The configuration (with `search` seconds of search in each fold) judged over k outer
    folds of users (model/judging/protocol.py), the table printed; report.json's `folds`.
    DataError when the shop is too small."""
    from model.judging.protocol import judge, outer_folds, summary
    from model.judging.report import folds_table
    from model.training.sessions import DataError

    if k < 2:
        raise DataError(f"--folds {k}: at least 2 (or 0 for none)")
    users = sorted({e["user_id"] for e in events})
    if len(users) < 2 * k:
        raise DataError(f"--folds {k}: {len(users)} users are too few for {k} folds")
    print(f"judging over {k} outer folds of users (each trains once on the others)")
    results = judge(events, config, outer_folds(users, k), log=print, trainer=trainer_of(search))
    out = summary(results)
    print(folds_table(out))
    return out


def live_rules(reg: Registry) -> tuple:
    """The rules in force under the registry's prefix; none (with a warning) when they do
    not read."""
    try:
        return read_rules(reg.r, reg.keys).rules
    except (RuleError, redis.exceptions.NoPermissionError) as exc:
        # the shares inform the promotion, they never block it
        print(f"warning: rule shares not shown: {exc}", file=sys.stderr)
        return ()


def validation_scores(model, events: list[dict], config):
    """A model's validation sessions (train's split, built with its vocabulary, features and
    session gap, labelled by config's label type) and its step scores of them."""
    from model.training.evaluate import model_step_scores
    from model.training.sessions import sessionize, split_by_user

    sessions = sessionize(events, model.meta.event_types, model.meta.features,
                          model.meta.session_gap_seconds, config.label_type,
                          model.inputs)  # fmt: skip
    _, valid = split_by_user(sessions, config.validation_fraction, config.seed,
                             config.test_fraction)  # fmt: skip
    return valid, model_step_scores(model, valid)


def gate(reg: Registry, result, events: list[dict], config, force: bool) -> list[str]:
    """The promotion gate of `train --promote`: print each live rule's share of validation
    sessions fired under the current model and the candidate; return the refusals (one line
    each; none with `force` or without a current model). The candidate is measured as it
    will score (its map fitted on these users), the current model as it scores, both on the
    same validation users."""
    from model.training.evaluate import metrics_of, model_step_scores
    from worker.rules.shares import fire_shares, share_lines

    current, rules = reg.current(), live_rules(reg)
    if current is None and not rules:
        return []
    ours_valid = result.validation_sessions
    ours_scores = model_step_scores(result.model, ours_valid)
    if current is not None:
        current_model = reg.load(current)
        theirs_valid, theirs_scores = validation_scores(current_model, events, config)
    if rules:
        now = None
        if current is not None and theirs_valid:
            now = fire_shares(rules, current_model, theirs_valid, theirs_scores[1])
        after = fire_shares(rules, result.model, ours_valid, ours_scores[1])
        for line in share_lines(rules, after, now, current, len(ours_valid)):
            print(line)
    if current is None or force:
        return []
    theirs = metrics_of(*theirs_scores)
    ours = metrics_of(*ours_scores) | {"auc_last": result.report["metrics"]["auc_last"]}
    print(comparison_line(theirs, ours, current, "validation"))
    return refusals(theirs, ours, current, "validation")
