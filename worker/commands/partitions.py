"""`intentstream partitions resize/repair`: the flags, and the calls into worker/partitions/
(the parser and help: worker/commands/cli.py). Nothing heavy is imported until a command
runs, so `partitions --help` stays light."""

from __future__ import annotations

import argparse
import sys

PARTITIONS_FLAGS = ["redis_url", "cluster", "prefix", "group", "socket_timeout"]


def cmd_partitions_resize(args: argparse.Namespace) -> int:
    """Move every user's state to a new partition count; the report, or one error line."""
    from worker.common.connection import connect_settings
    from worker.common.keys import Keys
    from worker.common.settings import SettingsError, load_settings
    from worker.partitions.resize import ResizeRefusedError, resize

    try:
        settings = load_settings(args, model=None)
        report = resize(connect_settings(settings), Keys(settings.prefix), settings.group, args.to)
    except (SettingsError, ResizeRefusedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


def cmd_partitions_repair(args: argparse.Namespace) -> int:
    """Put a partition's position back on a consistent entry (or say what it would do)."""
    from worker.common.connection import connect_settings
    from worker.common.keys import Keys
    from worker.common.settings import SettingsError, load_settings
    from worker.partitions.repair import RepairRefusedError, repair

    try:
        settings = load_settings(args, model=None)
        lines = repair(connect_settings(settings), Keys(settings.prefix), settings.group,
                       args.partition, args.to, args.dry_run)  # fmt: skip
    except (SettingsError, RepairRefusedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


def _setting_flags(parser: argparse.ArgumentParser) -> None:
    from worker.common.settings import add_setting_flags

    add_setting_flags(parser, PARTITIONS_FLAGS)


def add_flags(parts: argparse.ArgumentParser) -> None:
    """`partitions`'s actions; each action's flags are built when it is used."""
    psub = parts.add_subparsers(dest="partitions_command", required=True, metavar="ACTION")

    def resize_flags(resize: argparse.ArgumentParser) -> None:
        resize.add_argument("--to", type=int, required=True, metavar="N",
                            help="new partition count")  # fmt: skip
        _setting_flags(resize)

    resize = psub.add_parser(
        "resize",
        help="move every user's state to a new partition count (workers stopped)",
        populate=resize_flags,
    )
    resize.set_defaults(func=cmd_partitions_resize)

    def repair_flags(rep: argparse.ArgumentParser) -> None:
        rep.add_argument("partition", type=int, metavar="P", help="the partition to repair")
        rep.add_argument("--dry-run", action="store_true",
                         help="print what it finds and would run, write nothing")  # fmt: skip
        rep.add_argument("--to", metavar="ID",
                         help="the entry id to put the position on (default: the last commit "
                              "token's entry, else the stream's start)")  # fmt: skip
        _setting_flags(rep)

    rep = psub.add_parser(
        "repair",
        help="put a partition's position (acked) and the group back on a consistent entry",
        populate=repair_flags,
    )
    rep.set_defaults(func=cmd_partitions_repair)
