"""The `intentstream rules ...` sub-commands: set, list, show and delete the intent rules in
Redis (worker/rules/store.py); workers pick each change up by its version."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

# Light imports only: `intentstream rules --help` builds this parser (pydantic, redis and the
# backtest's kernels are imported by the action that uses them).
from worker.commands.args import csv, positive_int

if TYPE_CHECKING:
    from worker.common.connection import Client
    from worker.common.keys import Keys
    from worker.rules.definition import Rule

RULES_FLAGS = ["redis_url", "cluster", "prefix", "socket_timeout"]

_BACKTEST_EXAMPLES = """\
examples:
  intentstream rules backtest --from-redis
  intentstream rules backtest --data events.jsonl --rules rules.json --model model.npz --json
"""

_EXAMPLES = """\
examples:
  intentstream rules set coupon --above 0.7 --rearm-below 0.5 --cooldown 15m
  intentstream rules set checkout-nudge --above 0.85 --min-events 3 --types add_to_cart,checkout
  intentstream rules list
  intentstream rules show coupon
  intentstream rules delete coupon

A rule fires an action when a user's score reaches --above at an event, once per arming:
it re-arms at the first later score below --rearm-below, and at each new session. Every
change bumps the rules' version; running workers follow it."""

_SET_EXAMPLES = """\
examples:
  intentstream rules set coupon --above 0.7
  intentstream rules set coupon --above 0.7 --rearm-below 0.5 --cooldown 15m
  intentstream rules set late-cart --above 0.9 --min-events 5 --types add_to_cart --cooldown 1d

`set` replaces a rule of that name whole: flags not given take their defaults."""


def duration(text: str) -> int:
    """argparse type: a duration (500ms, 90s, 15m, 2h, 1d; a bare number is seconds) in ms."""
    from worker.rules.definition import RuleError, parse_duration

    try:
        return parse_duration(text)
    except RuleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def threshold(text: str) -> float:
    """argparse type: a rule's threshold, a number from 0 to 1 (the rule's own check, so the
    refusal names the flag: `error: --above: 2.0 is outside 0..1 ...`)."""
    from worker.rules.definition import threshold_problem

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    problem = threshold_problem(value)
    if problem and math.isfinite(value):  # nan and inf: the rule's message names the rule
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return value


def _cmd_rules_backtest(args: argparse.Namespace) -> int:
    from worker.commands.backtest import cmd_rules_backtest

    return cmd_rules_backtest(args)


def _setting_flags(parser: argparse.ArgumentParser, names: list[str]) -> None:
    from worker.common.settings import add_setting_flags

    add_setting_flags(parser, names)


def add_flags(rules: argparse.ArgumentParser) -> None:
    """`rules`'s actions (its parser and help: worker/commands/cli.py); each action's flags
    are built when it is used."""
    rules.epilog = _EXAMPLES
    rsub = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")

    def action(name: str, help: str, func, flags, epilog: str | None = None) -> None:
        def populate(cmd: argparse.ArgumentParser) -> None:
            flags(cmd)
            _setting_flags(cmd, RULES_FLAGS)

        cmd = rsub.add_parser(name, help=help, description=help, epilog=epilog, populate=populate)
        cmd.set_defaults(func=func)

    def name_arg(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("name", help="the rule's name (see `rules list`)")

    def list_flags(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")

    action("set", "add a rule or replace the one of that name", cmd_rules_set, _set_flags,
           _SET_EXAMPLES)  # fmt: skip
    action("list", "list the rules and their version", cmd_rules_list, list_flags)
    action("show", "print one rule as JSON (as stored)", cmd_rules_show, name_arg)
    action("delete", "remove a rule", cmd_rules_delete, name_arg)
    bt = rsub.add_parser(
        "backtest",
        help="replay events through the rules: the actions they would have written, and "
        "per rule actions/day, precision, recall and lead time",
        description="Replay events through the worker's own pipeline (model, rules, reasons) "
        "and print the actions the rules would have written, then per rule: actions per "
        "day, precision (actioned sessions that went on to purchase), recall (purchasing "
        "sessions actioned before the purchase) and the median lead time to the purchase.",
        epilog=_BACKTEST_EXAMPLES,
        populate=_backtest_flags,
    )
    bt.set_defaults(func=_cmd_rules_backtest)


def _set_flags(st: argparse.ArgumentParser) -> None:
    st.add_argument("name", help="the rule's name: 1-64 letters, digits, _ . - (e.g. coupon)")
    st.add_argument(
        "--above",
        type=threshold,
        required=True,
        metavar="X",
        help="fire when the score after an event is >= X (0 to 1: a score is a probability)",
    )
    st.add_argument(
        "--rearm-below",
        type=threshold,
        default=None,
        metavar="Y",
        help="after firing, re-arm at the first later score < Y; Y <= X (default: X)",
    )
    st.add_argument(
        "--cooldown",
        type=duration,
        default=0,
        metavar="DURATION",
        help="at least this long in event time between two firings for one user: 500ms, "
        "90s, 15m, 2h, 1d, a bare number of seconds (default: 0, none)",
    )
    st.add_argument(
        "--min-events",
        type=positive_int,
        default=1,
        metavar="N",
        help="fire only once the session holds N events, this one included (at most 100000)",
    )
    st.add_argument(
        "--types",
        type=csv,
        default=[],
        metavar="A,B,...",
        help="fire only at events of these types (default: any type)",
    )


def _backtest_flags(bt: argparse.ArgumentParser) -> None:
    from worker.commands.event_files import FORMATS

    source = bt.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", nargs="+", metavar="FILE",
                        help="JSON-lines event files (user_id, type, ts, event_id)")  # fmt: skip
    source.add_argument("--from-redis", action="store_true",
                        help="the events retained in the partition streams")  # fmt: skip
    bt.add_argument("--rules", metavar="FILE",
                    help="a JSON file of rules (a list, or `rules list --json`'s output) "
                    "instead of the rules in Redis")  # fmt: skip
    bt.add_argument("--format", choices=FORMATS, default="jsonl",
                    help="--data's format: JSON lines, Open CDP / REES46 CSV, or CSV with "
                    "--columns")  # fmt: skip
    bt.add_argument("--columns", metavar="MAPPING", default=None,
                    help="--format csv: user_id=COL,type=COL[,ts=COL,event_id=COL]")  # fmt: skip
    bt.add_argument("--json", action="store_true", help="print JSON instead of text")
    _setting_flags(bt, [*RULES_FLAGS, "model", "max_model_bytes", "batch_size",
                        "history_events", "event_id_window", "resend_window_seconds",
                        "max_ts_skew_ms"])  # fmt: skip


def _client(args: argparse.Namespace) -> tuple[Client, Keys]:
    from worker.common.connection import connect_settings
    from worker.common.keys import Keys
    from worker.common.settings import load_settings

    settings = load_settings(args, model=None)
    return connect_settings(settings), Keys(settings.prefix)


def number(x: float) -> str:
    """A threshold as given (repr, so nothing is rounded away), 1.0 as 1."""
    text = repr(x)
    return text.removesuffix(".0") if "e" not in text else text


def describe_rule(rule: Rule) -> str:
    """One line: the rule's conditions in words."""
    from worker.rules.definition import format_duration

    types = ", ".join(rule.types) if rule.types else "any type"
    return (
        f"above {number(rule.above)}, re-arm below {number(rule.rearm)}, cooldown "
        f"{format_duration(rule.cooldown_ms)}, min events {rule.min_events}, {types}"
    )


def cmd_rules_set(args: argparse.Namespace) -> int:
    # an invalid rule raises RuleError (a ValueError): main() prints its one line, exit 2,
    # before anything is sent to Redis
    from worker.rules.definition import make_rule
    from worker.rules.store import set_rule

    rule = make_rule(
        name=args.name,
        above=args.above,
        rearm_below=args.rearm_below,
        cooldown_ms=args.cooldown,
        min_events=args.min_events,
        types=tuple(args.types),
    )
    client, keys = _client(args)
    version = set_rule(client, keys, rule)
    print(f"rule {rule.name} set: {describe_rule(rule)} (rules version {version})")
    return 0


def cmd_rules_list(args: argparse.Namespace) -> int:
    from worker.rules.definition import format_duration, rule_to_dict
    from worker.rules.store import read_rules

    client, keys = _client(args)
    ruleset = read_rules(client, keys)
    if args.json:
        doc = {"version": ruleset.version, "rules": [rule_to_dict(r) for r in ruleset.rules]}
        print(json.dumps(doc, sort_keys=True))
        return 0
    header = ("name", "above", "rearm_below", "cooldown", "min_events", "types")
    rows = [
        (r.name, number(r.above), number(r.rearm), format_duration(r.cooldown_ms),
         str(r.min_events), ",".join(r.types) or "(any)")
        for r in ruleset.rules
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(no rules: `intentstream rules set NAME --above X` adds one)")
    print(f"rules version {ruleset.version}")
    return 0


def cmd_rules_show(args: argparse.Namespace) -> int:
    from worker.rules.definition import rule_to_json
    from worker.rules.store import read_rule

    client, keys = _client(args)
    print(rule_to_json(read_rule(client, keys, args.name)).decode())
    return 0


def cmd_rules_delete(args: argparse.Namespace) -> int:
    from worker.rules.store import delete_rule

    client, keys = _client(args)
    version = delete_rule(client, keys, args.name)
    print(f"rule {args.name} deleted (rules version {version})")
    return 0
