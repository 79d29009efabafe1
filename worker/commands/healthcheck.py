"""The `intentstream healthcheck` command: exit 0 only when a worker's main loop went round
recently, as its own /healthz says. The check itself is the container probe's
(worker/commands/probe.py); this door adds the settings' flags and --url."""

from __future__ import annotations

import argparse
import sys

from worker.commands.probe import healthz_url, report
from worker.common.settings import SettingsError, add_setting_flags, load_settings


def add_flags(hc: argparse.ArgumentParser) -> None:
    """The `healthcheck` sub-command's flags (its parser and help: worker/commands/cli.py)."""
    add_setting_flags(hc, ["metrics_host", "metrics_port"])
    hc.add_argument("--url", default=None, help="check this URL instead of the worker's /healthz")
    hc.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the reply")
    hc.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the worker's /healthz; print the outcome; 0 healthy, 1 not, 2 bad settings."""
    url = args.url
    if url is None:
        try:
            settings = load_settings(args, model=None)
        except SettingsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not settings.metrics_port:
            print("error: metrics are off (metrics port 0): nothing to check", file=sys.stderr)
            return 2
        url = healthz_url(settings.metrics_host, settings.metrics_port)
    return report(url, args.timeout)
