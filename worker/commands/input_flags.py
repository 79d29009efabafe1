"""The declared-input flags of `intentstream train` and `intentstream model init`
(model/inputs.py): `--numeric price[:log1p] --categorical category_code,brand --item
product_id --buckets N --input-dim D`, or `--inputs FILE`, a JSON list of declarations."""

from __future__ import annotations

import argparse
import json

from worker.commands.args import csv
from worker.common.events import EVENT_FIELDS
from worker.common.settings import SettingsError

DEFAULT_BUCKETS = 1024
DEFAULT_INPUT_DIM = 8


def add_input_flags(parser: argparse.ArgumentParser) -> None:
    """The flags declaring a model's inputs (kept in declaration order: the numeric inputs,
    then the categorical ones, then the items)."""
    parser.add_argument(
        "--numeric", type=csv, default=[], metavar="NAME[:log1p][:session],...",
        help="numeric input fields (a price), standardised; ':log1p' transforms first, "
        "':session' adds the session's running mean, min and max",
    )  # fmt: skip
    parser.add_argument(
        "--categorical", type=csv, default=[], metavar="NAME,...",
        help="categorical input fields (category_code, brand): a learned row per hash bucket",
    )  # fmt: skip
    parser.add_argument(
        "--item", type=csv, default=[], metavar="NAME,...",
        help="item input fields (product_id): a row per bucket, and whether the session "
        "saw the item before",
    )  # fmt: skip
    parser.add_argument(
        "--buckets", type=int, default=DEFAULT_BUCKETS, metavar="N",
        help="hash buckets of each categorical and item input (row 0: no value)",
    )  # fmt: skip
    parser.add_argument(
        "--input-dim", type=int, default=DEFAULT_INPUT_DIM, metavar="D",
        help="width of each categorical and item input's row",
    )  # fmt: skip
    parser.add_argument(
        "--inputs", dest="inputs", metavar="FILE", default=None,
        help="a JSON list of input declarations ({kind, name, buckets, dim, transform, session}), "
        "instead of the flags above",
    )  # fmt: skip


def input_declarations(args: argparse.Namespace) -> list[dict]:
    """The declarations the flags give (dicts: kind, name and the kind's settings), in
    order; SettingsError for a bad flag or file."""
    flags = [*args.numeric, *args.categorical, *args.item]
    if args.inputs:
        if flags:
            raise SettingsError("--inputs FILE replaces --numeric, --categorical and --item")
        try:
            with open(args.inputs, encoding="utf-8") as f:
                doc = json.load(f)
        except OSError as exc:
            raise SettingsError(f"cannot read --inputs {args.inputs}: {exc}") from None
        except ValueError as exc:
            raise SettingsError(f"--inputs {args.inputs}: not JSON ({exc})") from None
        if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
            raise SettingsError(f"--inputs {args.inputs}: a JSON list of objects expected")
        return doc
    out: list[dict] = [_numeric_declaration(item) for item in args.numeric]
    for kind, names in (("categorical", args.categorical), ("item", args.item)):
        for name in names:
            out.append({"kind": kind, "name": name, "buckets": args.buckets,
                        "dim": args.input_dim})  # fmt: skip
    return out


def _numeric_declaration(flag: str) -> dict:
    """A numeric input's declaration from its flag, NAME[:log1p|:none][:session]."""
    name, *options = flag.split(":")
    transforms = [o for o in options if o in ("log1p", "none")]
    session = [o for o in options if o == "session"]
    if (
        not name
        or len(transforms) > 1
        or len(session) > 1
        or len(options) > len(transforms) + len(session)
    ):
        raise SettingsError(
            f"--numeric {flag}: NAME, then optionally ':log1p' (or ':none') and ':session'"
        )
    declaration = {"kind": "numeric", "name": name, "transform": (transforms or ["none"])[0]}
    return declaration | ({"session": True} if session else {})


def describe_inputs(inputs, coverage: dict[str, float] | None = None) -> list[str]:
    """One line per declared input (fitted numbers included, and with `coverage` the share
    of the events that carry it), for reports."""
    lines = []
    for s in inputs:
        if s.kind == "numeric":
            line = f"  {s.name}: numeric, {s.transform}, mean {s.mean:.6g}, scale {s.scale:.6g}"
            line += ", with its session mean, min and max" if s.session else ""
        else:
            line = f"  {s.name}: {s.kind}, {s.buckets} buckets x {s.dim}"
        if coverage is not None and s.name in coverage:
            line += f"; in {coverage[s.name]:.0%} of the events"
        lines.append(line)
    return lines


def input_coverage(events: list[dict], names: list[str]) -> dict[str, float]:
    """The share of `events` that carry a value (not null, not empty) of each input."""
    n = max(len(events), 1)
    return {name: sum(e.get(name) not in (None, "") for e in events) / n for name in names}


def absent_inputs_warning(coverage: dict[str, float], events: list[dict]) -> str | None:
    """The problem naming the declared inputs no event carries (a misspelt name, a column not
    mapped), with the fields the events do carry; None when each appears somewhere."""
    missing = [name for name, share in coverage.items() if share == 0]
    if not missing:
        return None
    seen = sorted({k for e in events[:10_000] for k in e} - EVENT_FIELDS)
    return (f"no event carries input(s) {', '.join(missing)}: they would learn nothing "
            f"(the events' other fields: {', '.join(seen) or 'none'})")  # fmt: skip
