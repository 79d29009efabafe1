"""--help as every command shows it (the console script's sub-commands and the benchmarks,
which parse their own flags): each flag's default beside its explanation."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends `(default: X)` to a flag's help when it has a default worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "%(default)" in text or "(default:" in text or not action.option_strings:
            return text
        if default is None or default is False or default == []:
            return text
        if default is argparse.SUPPRESS or isinstance(action, argparse._VersionAction):
            return text
        shown = ",".join(default) if isinstance(default, list) else f"{default:g}" if isinstance(
            default, float) else str(default)  # fmt: skip
        return f"{text} (default: {shown.replace('%', '%%')})"
