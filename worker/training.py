"""The `intentstream train` command: events in (files or Redis), a model trained and
evaluated, a report written, the artifact published and promoted behind a quality gate."""

from __future__ import annotations

import argparse
import sys

import redis

from model.artifact import save_model
from worker.events import EventError, numbered_events
from worker.model_commands import with_registry
from worker.registry import Registry
from worker.settings import SettingsError, load_settings


def read_training_events(args: argparse.Namespace, settings) -> list[dict]:
    """Events from --data files (bad lines reported and skipped) or from Redis."""
    if args.from_redis:
        from worker.connection import connect_settings
        from worker.history import read_history

        client = connect_settings(settings)
        events, skipped = read_history(client, settings.prefix, settings.partitions)
        if skipped:
            print(f"skipped {skipped} unparseable stream entries", file=sys.stderr)
        return events
    events, bad = [], 0
    for path in args.data:

        def report(number: int, exc: EventError, path: str = path) -> None:
            nonlocal bad
            bad += 1
            if bad <= 10:
                print(f"{path}:{number}: {exc}", file=sys.stderr)

        try:
            with open(path, encoding="utf-8") as f:
                for e in numbered_events(f, report):
                    if e is not None:
                        events.append({"user_id": e.user_id, "type": e.type, "ts": e.ts})
        except OSError as exc:
            raise SettingsError(f"cannot read --data {path}: {exc.strerror}") from None
    if bad:
        print(f"skipped {bad} bad line(s)", file=sys.stderr)
    return events


def _print_metrics(report: dict) -> None:
    head = ("validation users", "AUC last", "AUC all", "logloss last", "logloss all")
    print("\n{:<24} {:>9} {:>9} {:>13} {:>12}".format(*head))
    for name, m in (("rnn", report["metrics"]), ("bag-of-types baseline", report["baseline"])):
        row = (m["auc_last"], m["auc_all"], m["logloss_last"], m["logloss_all"])
        print("{:<24} {:>9.4f} {:>9.4f} {:>13.4f} {:>12.4f}".format(name, *row))


def _push_metrics(url: str, report: dict) -> None:
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    m, data = report["metrics"], report["data"]
    values = {
        "intentstream_train_duration_seconds": ("Training run wall time.", report["seconds"]),
        "intentstream_train_validation_auc": ("Validation AUC, last step.", m["auc_last"]),
        "intentstream_train_validation_logloss": (
            "Validation log loss, last step.",
            m["logloss_last"],
        ),
        "intentstream_train_sessions": ("Training sessions.", data["train_sessions"]),
        "intentstream_train_events": ("Events read.", data["events"]),
    }
    for name, (doc, value) in values.items():
        Gauge(name, doc, registry=reg).set(value)
    push_to_gateway(url, job="intentstream_train", registry=reg)


def run_train(args: argparse.Namespace) -> int:
    """The `intentstream train` command; returns its exit code."""
    from pydantic import ValidationError

    from model.sessions import DataError
    from model.train import TrainConfig, evaluate_on, train, write_report

    if args.report:
        try:
            import matplotlib  # noqa: F401 - checked before hours of training, not after
        except ImportError:
            print("error: --report needs matplotlib: pip install 'intentstream[train]'",
                  file=sys.stderr)  # fmt: skip
            return 2
    try:
        settings = load_settings(args, model=None)
        config = TrainConfig(
            hidden=args.hidden, layers=args.layers, embedding_dim=args.embedding_dim,
            features=args.features, session_gap_seconds=args.session_gap,
            label_type=args.label_type, event_types=args.event_types or None, bptt=args.bptt,
            clip=args.clip, optimizer=args.optimizer, lr=args.lr, batch_size=args.batch_size,
            epochs=args.epochs, validation_fraction=args.validation_fraction, seed=args.seed,
            cell=args.cell, patience=args.patience,
        )  # fmt: skip
        events = read_training_events(args, settings)
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
            if not args.quiet:
                print(
                    "(no progress bar: pip install 'intentstream[train]' for one)", file=sys.stderr
                )
        progress = None if args.quiet or tqdm is None else tqdm
        result = train(events, config, progress=progress)
    except (DataError, SettingsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"error: invalid training configuration: {exc.errors()[0]['loc'][0]}: "
              f"{exc.errors()[0]['msg']}", file=sys.stderr)  # fmt: skip
        return 2
    except redis.RedisError as exc:
        print(f"error: reading events from Redis: {exc}", file=sys.stderr)
        return 2
    report = result.report
    print(report["kept_epoch"]["reason"])
    _print_metrics(report)
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
        version = reg.publish_model(result.model)
        print(f"published version {version}")
        if not args.promote:
            return 0
        current = reg.current()
        if current is not None and not args.force:
            theirs = evaluate_on(reg.load(current), events, config)["auc_last"]
            ours = report["metrics"]["auc_last"]
            if not ours >= theirs:  # a NaN AUC never promotes
                print(
                    f"not promoted: validation AUC {ours:.4f} is below current version "
                    f"{current}'s {theirs:.4f} on the same users (--force promotes anyway)"
                )
                return 1
        reg.promote(version)
        print(f"promoted version {version} to current")
        return 0

    return with_registry(args, publish)
