"""`intentstream model ...`: its actions and their flags (the parser and help:
worker/commands/cli.py; the bodies: worker/commands/models.py). Imported when `model` is
parsed; each action's flags built when it is used."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from worker.commands.args import csv, positive_int
from worker.commands.cli import (
    DATA_HELP,
    add_data_format_flags,
    add_input_flags,
    add_setting_flags,
    lazy,
)

REGISTRY_FLAGS = ["redis_url", "cluster", "prefix", "socket_timeout"]


def _init_flags(init: argparse.ArgumentParser) -> None:
    from model.feature_names import feature_help  # the names only: no Numba

    init.add_argument(
        "--event-types",
        type=csv,
        required=True,
        metavar="A,B,...",
        help="event type names; one more row is reserved for unknown types",
    )
    init.add_argument(
        "--cell",
        choices=["rnn", "gru", "lstm"],
        default="rnn",
        help="Elman RNN, GRU or LSTM (see docs/models.md, Choosing a cell)",
    )
    init.add_argument("--hidden", type=positive_int, default=64, help="H, the state width")
    init.add_argument("--layers", type=positive_int, default=1, help="L, stacked layers")
    init.add_argument(
        "--features",
        type=csv,
        default=[],
        metavar="A,B,...",
        help=f"numeric features after the embedding row; known: {feature_help()} (default: none)",
    )
    init.add_argument(
        "--embedding-dim",
        type=positive_int,
        default=None,
        help="D, the width of each type's row (default: min(16, hidden))",
    )
    init.add_argument(
        "--head", choices=["sigmoid", "identity"], default="sigmoid", help="the output function"
    )
    init.add_argument(
        "--wide-head",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the head also reads the features and the inputs' numeric columns (a wide part)",
    )
    init.add_argument(
        "--session-gap",
        type=float,
        default=1800.0,
        help="seconds; a longer gap starts a new session (0 = never)",
    )
    init.add_argument("--seed", type=int, default=0, help="same seed, same bytes")
    add_input_flags(init)
    init.add_argument("--out", required=True, help="artifact file to write (.npz)")


def _evaluate_flags(ev: argparse.ArgumentParser) -> None:
    # nargs "*": none given is said by cmd_model_evaluate, which can tell a --data that took them
    ev.add_argument(
        "versions",
        nargs="*",
        metavar="VERSION|FILE",
        help="what to compare (before --data, which takes every file after it)",
    )
    src = ev.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-redis", action="store_true", help="the retained event streams")
    src.add_argument("--data", nargs="+", metavar="FILE", help=DATA_HELP)
    add_data_format_flags(ev)
    ev.add_argument("--since", metavar="AGE", help="only events this recent: 90m, 24h, 7d")
    ev.add_argument("--partitions", type=positive_int, default=None,
                    help="partitions to read (default: the recorded count)")  # fmt: skip
    ev.add_argument("--label-type", default="purchase", help="for models whose meta names none")
    ev.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ev.add_argument("--pushgateway", metavar="URL", help="push the metrics to a Pushgateway")
    ev.add_argument("--reliability", metavar="FILE.png",
                    help="write the versions' reliability diagrams (PNG) there")  # fmt: skip
    ev.add_argument("--held-out", action="store_true",
                    help="also judge each model on the test users its training held out of "
                    "these events, beside baselines fitted on the other users")  # fmt: skip


def add_flags(model: argparse.ArgumentParser) -> None:
    """`model`'s actions: each one's flags built when it is used."""
    msub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    init = msub.add_parser(
        "init", help="write a seeded random model artifact", populate=_init_flags
    )
    init.set_defaults(func=lazy("worker.commands.models", "cmd_model_init"))

    def registry_command(
        name: str, help: str, func: str, flags: Callable[[argparse.ArgumentParser], None]
    ) -> None:
        def populate(cmd: argparse.ArgumentParser) -> None:
            flags(cmd)
            add_setting_flags(cmd, REGISTRY_FLAGS)

        cmd = msub.add_parser(name, help=help, description=help, populate=populate)
        cmd.set_defaults(func=lazy("worker.commands.models", func))

    def version_arg(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("version", help="a registry version (see `model list`)")

    def force_flag(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--force", action="store_true",
                         help="promote even if the gate finds it worse than the current model "
                         "on the retained history")  # fmt: skip

    def publish_flags(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("file", help="the artifact file (.npz)")
        cmd.add_argument("--promote", action="store_true",
                         help="also make it current, behind the promotion gate")  # fmt: skip
        force_flag(cmd)

    def promote_flags(cmd: argparse.ArgumentParser) -> None:
        version_arg(cmd)
        force_flag(cmd)

    def shadow_flags(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("version", nargs="?", help="the challenger; none: show the shadow")
        cmd.add_argument("--off", action="store_true", help="stop shadow scoring")

    def export_flags(cmd: argparse.ArgumentParser) -> None:
        version_arg(cmd)
        cmd.add_argument("--out", required=True, help="artifact file to write (.npz)")

    registry_command(
        "show", "print a model's config, array shapes, size", "cmd_model_show",
        lambda cmd: cmd.add_argument("file", metavar="FILE|VERSION",
                                     help="an artifact file or a registry version"),
    )  # fmt: skip
    registry_command(
        "publish", "store an artifact as a new version", "cmd_model_publish", publish_flags
    )
    registry_command(
        "list", "list the registry's versions (* = current)", "cmd_model_list", lambda _: None
    )
    registry_command(
        "promote", "make a version current behind the promotion gate; workers follow",
        "cmd_model_promote", promote_flags,
    )  # fmt: skip
    registry_command("rollback", "make the previous current version current",
                     "cmd_model_rollback", lambda _: None)  # fmt: skip
    registry_command(
        "evaluate",
        "versions (or .npz files) side by side on live data: ROC AUC, log loss, ECE, Brier",
        "cmd_model_evaluate",
        _evaluate_flags,
    )
    registry_command("shadow", "score every event with a challenger version too (or --off)",
                     "cmd_model_shadow", shadow_flags)  # fmt: skip
    registry_command(
        "export", "write a version's artifact to a file", "cmd_model_export", export_flags
    )
