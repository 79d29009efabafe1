"""Help that teaches: every flag explained, defaults shown, the version, and a bad flag
answered with the usage of the sub-command it was given to."""

from __future__ import annotations

import argparse
import re

import pytest

from model.training.train import TrainConfig
from tests.conftest import run_cli
from worker.commands.args import sub_parsers
from worker.commands.cli import build_parser
from worker.common.settings import Settings


def all_parsers() -> list[argparse.ArgumentParser]:
    top = build_parser()
    return [top, *sub_parsers(top)]


def test_every_flag_and_argument_has_help():
    missing = []
    for parser in all_parsers():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help or action.help == action.dest:
                missing.append(f"{parser.prog}: {action.option_strings or action.dest}")
    assert not missing, missing


def test_every_command_is_covered_and_train_has_its_config_flags():
    progs = {p.prog for p in all_parsers()}
    for command in ("model init", "model show", "score", "worker", "publish", "train", "demo"):
        assert f"intentstream {command}" in progs
    train = next(p for p in all_parsers() if p.prog == "intentstream train")
    dests = {a.dest for a in train._actions}
    assert set(TrainConfig.model_fields) <= dests  # a new TrainConfig field gets a flag


def test_train_flag_defaults_are_trainconfig_defaults():
    train = next(p for p in all_parsers() if p.prog == "intentstream train")
    args = train.parse_args(["--data", "x.jsonl"])
    from worker.commands.train import train_config

    assert train_config(args) == TrainConfig()


@pytest.mark.integration
def test_help_shows_defaults():
    out = run_cli("train", "--help").stdout
    flat = " ".join(out.split())  # argparse wraps lines
    assert "--hidden HIDDEN H, the state width per layer (default: 64)" in flat
    assert "(default: 0.005)" in flat and "(default: adam)" in flat
    assert "--min-type-count" in flat and "(default: 10)" in flat
    worker = " ".join(run_cli("worker", "--help").stdout.split())
    assert "env INTENTSTREAM_BATCH_SIZE; default: 1024" in worker
    assert "unix://" in worker  # the URL forms a user may give
    assert "--log-level" in worker and "log level: DEBUG, INFO" in worker
    demo = " ".join(run_cli("demo", "--help").stdout.split())
    assert "synthetic events per second (default: 500)" in demo
    assert "unix://" in demo


@pytest.mark.integration
def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert re.fullmatch(r"intentstream \d+\.\d+\.\d+\S*\n", result.stdout)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["worker", "--no-such-flag"], "usage: intentstream worker"),
        (["model", "init", "--event-types", "a", "--out", "x", "--nope"],
         "usage: intentstream model init"),
        (["train", "--data", "x", "--epoch", "3", "--bogus"], "usage: intentstream train"),
    ],
)  # fmt: skip
def test_a_bad_flag_gets_the_sub_commands_usage(argv, usage):
    result = run_cli(*argv)
    assert result.returncode == 2
    assert result.stderr.startswith(usage), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["demo", "--rate", "-5"], "error: --rate: must be > 0, got -5 (see intentstream demo"),
        (["model", "init", "--event-types", "a", "--hidden", "x"],
         "error: --hidden: expected an integer, got 'x' (see intentstream model init --help)"),
        (["score", "--model", "m.npz", "--batch-size", "lots"], "error: --batch-size: "),
        (["publish", "--synthetic", "many"], "error: --synthetic: "),
        (["train", "--data", "x", "--optimizer", "rmsprop"], "error: --optimizer: invalid choice"),
        (["worker", "--metrics-port"], "error: --metrics-port: expected one argument"),
    ],
)  # fmt: skip
def test_a_bad_flag_value_is_one_line_like_every_other_error(argv, line):
    result = run_cli(*argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr


@pytest.mark.integration
def test_bench_help_shows_defaults_and_the_scaling_flags():
    flat = " ".join(run_cli("bench", "--help").stdout.split())
    assert "backlog size (default: 200000)" in flat and "(default: afbcde)" in flat
    for flag in ("--workers", "--partitions", "--cluster"):
        assert flag in flat
    scaling = " ".join(run_cli("bench", "--workers", "1", "--help").stdout.split())
    assert "partitions of the streams; several (1,8)" in scaling
    assert "ratio's 90% interval over the rounds (default: 8)" in scaling
    assert "rounds, with several --partitions or --against-one (default: 1)" in scaling
    assert "with --cluster: each of --rounds runs the worker (the first count) on the cluster" in (
        scaling
    )
    assert "comma-separated worker counts (default: 1,2,4)" in scaling
    assert "with several --partitions on one Redis: the counts side by side" in scaling


@pytest.mark.integration
@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--rate", "0", "--rate: must be > 0, got 0"),
        ("--rate", "-5", "--rate: must be > 0, got -5"),
        ("--rate", "nan", "expected a finite number"),
        ("--users", "0", "--users: must be >= 1, got 0"),
        ("--seconds", "0", "--seconds: must be > 0"),
        ("--metrics-port", "70000", "port number"),
    ],
)
def test_demo_refuses_bad_values_before_starting(flag, value, message):
    result = run_cli("demo", flag, value)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert "started a private redis-server" not in result.stdout


def test_settings_flags_name_their_environment_variable():
    worker = next(p for p in all_parsers() if p.prog == "intentstream worker")
    helps = {a.dest: a.help for a in worker._actions}
    for name in Settings.model_fields:
        assert f"INTENTSTREAM_{name.upper()}" in helps[name]


def test_the_readme_documents_every_train_and_demo_flag():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    readme = "\n".join(page.read_text() for page in pages)  # the README and its guides
    for prog in ("intentstream train", "intentstream demo", "intentstream worker"):
        parser = next(p for p in all_parsers() if p.prog == prog)
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help":
                    assert f"`{flag}" in readme, f"{prog} {flag} is not in the README or docs/"
