"""argparse as the console script uses it: defaults shown in --help, errors answered with the
sub-command's own usage, value types that say what is wrong, flags built on first use."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import NoReturn

from worker.common.cli_help import HelpFormatter


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose sub-parsers share its formatter and remember themselves.

    `populate`, when given, adds the parser's arguments the first time it parses or prints
    help, so a sub-command whose flags need a slow import costs nothing to the others.
    Every parser records itself as `args._parser`, the innermost sub-command's winning, so
    errors found after parsing can print the right usage.
    """

    def __init__(self, *args, populate: Callable[[Parser], None] | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._populate = populate
        self.set_defaults(_parser=self)

    def populated(self) -> Parser:
        """This parser with its arguments added (runs `populate` once)."""
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate(self)
        return self

    def error(self, message: str) -> NoReturn:
        """A bad value for a flag is one line naming the flag, as every other mistake the
        commands report (`error: --rate: must be > 0, got -5`); an unknown or missing
        argument gets the usage too."""
        if message.startswith("argument "):
            flag, _, problem = message.removeprefix("argument ").partition(": ")
            name = flag.split("/")[-1]  # -x/--long: the long form
            self.exit(2, f"error: {name}: {problem} (see {self.prog} --help)\n")
        super().error(message)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        self.populated()
        return super().parse_known_args(args, namespace)

    def _parse_known_args(self, *args, **kwargs):
        # the entry point sub-parsers are called through in some Python versions
        self.populated()
        return super()._parse_known_args(*args, **kwargs)

    def format_help(self) -> str:
        self.populated()
        return super().format_help()

    def format_usage(self) -> str:
        self.populated()
        return super().format_usage()


def sub_parsers(parser: argparse.ArgumentParser) -> list[Parser]:
    """Every parser below this one (depth first), populated: for tests and documentation."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found.append(sub.populated() if isinstance(sub, Parser) else sub)
                found += sub_parsers(sub)
    return found


def csv(value: str) -> list[str]:
    """A comma-separated list; empty items dropped, so '' is the empty list."""
    return [v.strip() for v in value.split(",") if v.strip()]


def _number(kind: type, above: float | None, at_least: float | None):
    name = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be > {above:g}, got {text}")
        if at_least is not None and not value >= at_least:
            raise argparse.ArgumentTypeError(f"must be >= {at_least:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some messages
    return parse


positive_float = _number(float, above=0, at_least=None)
positive_int = _number(int, above=None, at_least=1)
non_negative_int = _number(int, above=None, at_least=0)


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {text}")
    return value
