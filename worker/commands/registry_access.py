"""How a command reaches the model registry: the settings its flags give, one connection."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from worker.common.connection import connect_settings
from worker.common.settings import load_settings
from worker.lifecycle.registry import Registry


def registry_of(args: argparse.Namespace) -> Registry:
    """The registry under the prefix, on the Redis the command's flags name."""
    settings = load_settings(args, model=None)
    return Registry(connect_settings(settings), settings.prefix)


def with_registry(args: argparse.Namespace, action: Callable[[Registry], int]) -> int:
    """Run action(registry). Registry and Redis errors propagate: main() prints them as one
    line on stderr and exits 2."""
    return action(registry_of(args))
