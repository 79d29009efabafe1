"""The `intentstream` console script: one entry point, one sub-command per job."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable

# Only what every command needs is imported here: a command that does no work (--version,
# --help, a bad flag) starts without numpy, Numba, redis or pydantic. A sub-command's flags are
# built when it is parsed or its help printed (Parser's `populate`), its body imported when it
# runs (`lazy`).
from worker.commands.args import Parser, port_number, positive_float, positive_int

# Exit code of a user error or an unreachable service (worker/commands/errors.py).
USAGE_EXIT = 2


class lazy:  # noqa: N801 (used as a function: `func=lazy(module, name)`)
    """A sub-command's function, imported from `module` when it runs (`load`)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.__name__ = module, name

    def load(self) -> Callable[[argparse.Namespace], int]:
        return getattr(importlib.import_module(self.module), self.__name__)

    def __call__(self, args: argparse.Namespace) -> int:
        return self.load()(args)


def add_setting_flags(parser: argparse.ArgumentParser, names: list[str] | None = None) -> None:
    """worker/common/settings.py's flags (pydantic, imported only for a parser built)."""
    from worker.common.settings import add_setting_flags as add

    add(parser, names)


def add_input_flags(parser: argparse.ArgumentParser) -> None:
    from worker.commands.input_flags import add_input_flags as add

    add(parser)


class _Version(argparse.Action):
    """`--version`: the installed version, looked up only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit") -> None:  # fmt: skip
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def _cmd_demo(args: argparse.Namespace) -> int:
    from worker.commands.serve import stop_on_signals

    stop = stop_on_signals()
    # imported after the signal handlers, and by this command only: the demo runs the engine
    from worker.commands.demo import run_demo

    code = run_demo(
        args.redis_url,
        args.rate,
        args.users,
        args.seconds,
        args.metrics_port,
        stop,
        sys.stdout,
        train_first=not args.random_model,
        cluster=args.cluster,
    )
    return stop.exit_code(code)


def _cmd_worker(args: argparse.Namespace) -> int:
    from worker.commands.errors import say
    from worker.common.settings import SettingsError, load_settings

    try:  # a bad setting is said before the engine's imports (the command loads them again)
        load_settings(args)
    except SettingsError as exc:
        say("error", str(exc), args)
        return USAGE_EXIT
    from worker.commands.serve import cmd_worker

    return cmd_worker(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_args[:1] == ["--real"]:
        return _cmd_bench_real(args)
    if args.bench_args[:1] == ["--webhooks"]:  # no engine: worker/bench/webhooks.py
        from worker.bench.webhooks import main as webhooks_main

        return webhooks_main(args.bench_args[1:])
    from worker.bench.throughput import main as bench_main  # the engine: for this command only

    return bench_main(args.bench_args)


def _cmd_bench_real(args: argparse.Namespace) -> int:
    """`bench --real`: train's flags, judged over repeated outer folds (commands/judge.py)."""
    from worker.commands.judge import run_real_bench

    p = Parser(
        prog="intentstream bench --real",
        description="A training configuration judged on held-out users over repeated outer "
        "folds, beside logistic regression and gradient boosting on session features.",
    )
    _add_train_flags(p)
    p.add_argument("--repeats", type=int, default=2, help="rounds of --folds outer folds")
    real = p.parse_args(args.bench_args[1:])
    real._parser = p
    return run_real_bench(real)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("intentstream")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


DATA_HELP = "event files: JSON lines, or CSV (--format); a .gz file is read gunzipped"


def add_data_format_flags(cmd: argparse.ArgumentParser) -> None:
    """`--format` and `--columns`: how the --data files read (worker/commands/event_files.py)."""
    cmd.add_argument(
        "--format",
        choices=["jsonl", "opencdp", "csv"],
        default="jsonl",
        help="--data files: JSON lines, Open CDP / REES46 CSV (event_time, event_type, "
        "product_id, category_code, brand, price, user_id), or CSV mapped by --columns",
    )
    cmd.add_argument(
        "--columns",
        metavar="MAPPING",
        default=None,
        help="--format csv: FIELD=COLUMN pairs, user_id and type required, e.g. "
        "user_id=visitorid,type=event,ts=timestamp (ts: epoch ms, epoch s or ISO 8601)",
    )


def _add_train_flags(tr: argparse.ArgumentParser) -> None:
    """The `train` flags: data source, TrainConfig's fields, outputs. Built on first use."""
    src = tr.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", nargs="+", metavar="FILE", help=DATA_HELP)
    src.add_argument("--from-redis", action="store_true", help="the retained event streams")
    add_data_format_flags(tr)
    add_setting_flags(tr, ["redis_url", "cluster", "prefix", "partitions", "socket_timeout"])
    add_input_flags(tr)
    from worker.commands.train import add_train_config_flags

    add_train_config_flags(tr)
    tr.add_argument(
        "--init-from",
        metavar="VERSION|FILE",
        help="fine-tune: start from this registry version's (or artifact's) weights, keep its "
        "architecture and vocabulary; the new model continues its users' states",
    )
    tr.add_argument(
        "--folds",
        type=int,
        default=0,
        metavar="K",
        help="first judge the configuration over K outer folds of users (each fold's users "
        "held out from one training run, beside the baselines); 0: none",
    )
    tr.add_argument(
        "--search",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="try hyper-parameters around the given ones for about this long and keep the one "
        "with the lowest validation loss (the test users take no part); 0: none",
    )
    tr.add_argument("--out", help="write the trained artifact here")
    tr.add_argument("--report", metavar="DIR", help="write report.json and report.png here")
    tr.add_argument("--publish", action="store_true", help="register it in the Redis registry")
    tr.add_argument(
        "--promote", action="store_true", help="publish; make current unless its AUC is lower"
    )
    tr.add_argument("--force", action="store_true", help="promote even if worse")
    tr.add_argument("--pushgateway", metavar="URL", help="push the run's metrics there")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_score_flags(score: argparse.ArgumentParser) -> None:
    score.add_argument("--model", required=True, help="model artifact file")
    score.add_argument("events", nargs="?", help="JSON-lines file (default: stdin)")
    score.add_argument(
        "--batch-size",
        type=positive_int,
        default=1024,
        help="lines per kernel call (a terminal is scored line by line)",
    )
    score.add_argument(
        "--raw",
        action="store_true",
        help="the head's score as trained, without the artifact's calibration",
    )


def _add_worker_flags(worker: argparse.ArgumentParser) -> None:
    add_setting_flags(worker)
    worker.add_argument(
        "--max-seconds",
        type=positive_float,
        default=None,
        help="stop this many seconds after the start, every wait included (a Redis still "
        "unreachable then: exit 2; default: run until SIGTERM/SIGINT)",
    )


def _add_publish_flags(pub: argparse.ArgumentParser) -> None:
    pub.add_argument("events", nargs="?", help="JSON-lines file (default: stdin)")
    add_setting_flags(pub, ["redis_url", "cluster", "prefix", "partitions", "socket_timeout"])
    pub.add_argument(
        "--synthetic",
        type=positive_int,
        default=None,
        metavar="N",
        help="publish N synthetic shop events instead of reading lines",
    )
    pub.add_argument("--users", type=positive_int, default=1000, help="synthetic users")
    pub.add_argument("--seed", type=int, default=0, help="synthetic data seed")
    pub.add_argument(
        "--start-ms",
        type=int,
        default=None,
        metavar="MS",
        help="epoch ms of the first synthetic event without --rate (default: dated so that "
        "the last one is now: a backlog of recent history)",
    )
    pub.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        help="events per second (default: as fast as Redis takes them)",
    )


def _add_demo_flags(demo: argparse.ArgumentParser) -> None:
    demo.add_argument(
        "--redis-url",
        default=None,
        help="use this Redis (redis://, rediss:// or "
        "unix://) instead of a private one; it gets synthetic events",
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="the --redis-url names a node of a Redis Cluster (use the cluster client)",
    )
    demo.add_argument(
        "--rate", type=positive_float, default=500.0, help="synthetic events per second"
    )
    demo.add_argument("--users", type=positive_int, default=200, help="synthetic users")
    demo.add_argument(
        "--seconds",
        type=positive_float,
        default=None,
        help="stop after this long (default: until Ctrl-C)",
    )
    demo.add_argument(
        "--metrics-port",
        type=port_number,
        default=9108,
        help="the worker's metrics port; 0 = any free port",
    )
    demo.add_argument(
        "--random-model", action="store_true", help="an empty registry gets an untrained model"
    )


def _module_flags(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """A sub-command whose flags (and function) its own module adds: `add_flags(parser)`,
    imported when the sub-command is used."""

    def populate(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_flags(parser)

    return populate


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command; their flags are built on first use."""
    p = Parser(
        prog="intentstream",
        description="Real-time purchase-intent scoring on Redis Streams.",
        epilog="`intentstream COMMAND --help` lists a command's flags and their defaults.",
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # `intentstream model ...`: worker/commands/model_flags.py
    sub.add_parser("model", help="create and inspect model artifacts; the registry",
                   populate=_module_flags("worker.commands.model_flags"))  # fmt: skip

    # `intentstream rules ...`: worker/commands/rules.py
    sub.add_parser(
        "rules",
        help="the intent rules: when a score fires an action",
        description="Set, list, show and delete the intent rules in Redis.",
        populate=_module_flags("worker.commands.rules"),
    )

    # `intentstream webhooks ...` and `deliver`: worker/commands/webhooks.py
    sub.add_parser(
        "webhooks",
        help="the webhook endpoints the actions are delivered to",
        description="Add, list, remove, test the webhook endpoints in Redis; replay an "
        "endpoint's dead letters.",
        populate=_module_flags("worker.commands.webhooks"),
    )
    deliver = sub.add_parser(
        "deliver",
        help="POST every action to every webhook endpoint, signed, at least once",
        description="Deliver the intent actions to the webhook endpoints (`webhooks add`): "
        "Standard Webhooks signatures, retries with backoff, dead letters (docs/webhooks.md).",
        populate=lambda cmd: importlib.import_module("worker.commands.webhooks").add_deliver_flags(
            cmd
        ),
    )
    deliver.set_defaults(func=lazy("worker.commands.webhooks", "cmd_deliver"))

    score = sub.add_parser("score", help="score JSON-lines events offline, state in memory",
                           populate=_add_score_flags)  # fmt: skip
    score.set_defaults(func=lazy("worker.commands.score", "cmd_score"))

    sub.add_parser(  # why a user's score is what it is: worker/commands/explain.py
        "explain",
        help="the events of a user's session that moved their score most (leave-one-out)",
        description="Replay the user's recent session (the state's `recent` field) with each "
        "event left out in turn; list each event's delta = score with all events - score "
        "without it, and mark the 3 largest |delta|s: the reasons.",
        populate=_module_flags("worker.commands.explain"),
    )

    worker = sub.add_parser("worker", help="consume event streams and write scores (the main job)",
                            populate=_add_worker_flags)  # fmt: skip
    worker.set_defaults(func=_cmd_worker)

    pub = sub.add_parser("publish", help="publish JSON-lines or synthetic events to the streams",
                         populate=_add_publish_flags)  # fmt: skip
    pub.set_defaults(func=lazy("worker.commands.publish", "cmd_publish"))

    tr = sub.add_parser(
        "train",
        help="train a model with truncated BPTT; report; publish",
        populate=_add_train_flags,
    )
    tr.set_defaults(func=lazy("worker.commands.train", "run_train"))

    demo = sub.add_parser("demo", help="the whole loop live, on a private Redis by default",
                          populate=_add_demo_flags)  # fmt: skip
    demo.set_defaults(func=_cmd_demo, private_redis=True)  # without --redis-url

    sub.add_parser(  # a web view for the people who set the rules: worker/console/
        "console",
        help="the web console: live figures, rules with backtests, users, actions, models",
        description="Serve the web console (behind a token) on the workers' Redis.",
        populate=_module_flags("worker.console.cli"),
    )

    sub.add_parser(  # the container HEALTHCHECK's command: worker/commands/healthcheck.py
        "healthcheck",
        help="exit 0 if the local worker's main loop is alive (its /healthz), else 1",
        populate=_module_flags("worker.commands.healthcheck"),
    )

    sub.add_parser("partitions",  # worker/commands/partitions.py, calling worker/partitions/
                   help="change the partition count of the streams; repair a position",
                   populate=_module_flags("worker.commands.partitions"))  # fmt: skip

    bench = sub.add_parser("bench", help="end-to-end benchmark against baselines", add_help=False)
    bench.set_defaults(func=_cmd_bench, private_redis=True)
    return p


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None, interruptible: bool = False) -> int:
    """Run the console script; return its exit code.

    Every sub-command's failures a user can fix (bad flags, files, data, an unreachable
    Redis) end as one line on stderr and exit 2 (see worker/commands/errors.py); a closed stdout
    pipe (`| head`) exits quietly with 141, as a process killed by SIGPIPE; Ctrl-C exits 130.
    `interruptible`: Ctrl-C raises KeyboardInterrupt from the command's start (the console
    script leaves at once before it, worker/commands/entry.py).
    """
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        args.bench_args = rest  # the benchmark parses its own flags (and --help)
    elif rest:
        args._parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if any(name.startswith("INTENTSTREAM_") for name in os.environ):
        from worker.commands.errors import say
        from worker.common.settings import unknown_variables

        for warning in unknown_variables(os.environ):
            say("warning", warning, args)
    interrupted = False

    def interrupt(_sig: int, _frame: object) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    try:
        func = args.func
        if isinstance(func, lazy):  # its imports (numpy, Numba) as the parsing's: Ctrl-C
            func = func.load()  # leaves at once (a C extension stopped mid-import can fail)
        if interruptible:
            signal.signal(signal.SIGINT, interrupt)
        code = func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if interrupted:  # a failure Ctrl-C caused (an import cut short, ...): still Ctrl-C
            return 130
        from worker.commands.errors import explain, say

        line = explain(exc, args)
        if line is None:
            raise
        if os.environ.get("INTENTSTREAM_TRACEBACK"):
            traceback.print_exc()  # for a bug report; the exit code stays the documented one
        say("error", line, args)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())
