"""`intentstream webhooks add|list|remove|test|replay` (the endpoints in Redis) and
`intentstream deliver` (the deliverer process): docs/webhooks.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

# Light imports only: `--help` builds these parsers (redis, httpx and pydantic are imported
# by the action that runs).
from worker.commands.args import csv, positive_float

if TYPE_CHECKING:
    from worker.common.connection import Client
    from worker.common.keys import Keys

STORE_FLAGS = ["redis_url", "cluster", "prefix", "socket_timeout"]
DELIVER_FLAGS = [
    "redis_url",
    "cluster",
    "prefix",
    "partitions",
    "consumer",
    "block_ms",
    "socket_timeout",
    "metrics_host",
    "metrics_port",
    "log_format",
    "log_level",
    "webhook_retry_cap_seconds",
    "webhook_max_age_seconds",
    "webhook_senders",
    "webhook_connections",
    "webhook_max_held",
    "webhook_claim_idle_seconds",
    "webhook_poll_seconds",
    "webhook_measure_seconds",
]

_EXAMPLES = """\
examples:
  intentstream webhooks add crm --url https://crm.example/hooks/intent --secret whsec_...
  intentstream webhooks add coupons --url https://shop.example/wh --secret - --rules coupon
  intentstream webhooks list
  intentstream webhooks test crm
  intentstream webhooks replay crm --since 24h
  intentstream webhooks remove crm

`intentstream deliver` POSTs every action to every endpoint, signed (Standard Webhooks)."""


def _settings_flags(parser: argparse.ArgumentParser, names: list[str]) -> None:
    from worker.common.settings import DeliverySettings, add_setting_flags

    add_setting_flags(parser, names, DeliverySettings)


def add_flags(webhooks: argparse.ArgumentParser) -> None:
    """`webhooks`'s actions; each action's flags built when it is used."""
    webhooks.epilog = _EXAMPLES
    sub = webhooks.add_subparsers(dest="webhooks_command", required=True, metavar="ACTION")

    def action(name: str, help: str, func, flags) -> None:
        def populate(cmd: argparse.ArgumentParser) -> None:
            flags(cmd)
            _settings_flags(cmd, STORE_FLAGS)

        cmd = sub.add_parser(name, help=help, description=help, populate=populate)
        cmd.set_defaults(func=func)

    def name_arg(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("name", help="the endpoint's name (see `webhooks list`)")

    def list_flags(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--json", action="store_true", help="print JSON instead of a table")

    def replay_flags(cmd: argparse.ArgumentParser) -> None:
        name_arg(cmd)
        cmd.add_argument(
            "--since",
            metavar="AGE",
            default=None,
            help="only dead letters given up this recently: 90m, 24h, 7d (default: all)",
        )

    action("add", "add an endpoint (or --replace one)", cmd_add, _add_flags)
    action("list", "list the endpoints (secrets masked)", cmd_list, list_flags)
    action(
        "remove",
        "remove an endpoint, its consumer groups and its dead letters",
        cmd_remove,
        name_arg,
    )
    action("test", "POST a signed ping to an endpoint; exit 0 on a 2xx", cmd_test, name_arg)
    action(
        "replay",
        "send an endpoint's dead letters again; delivered ones are removed",
        cmd_replay,
        replay_flags,
    )


def _add_flags(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("name", help="the endpoint's name: 1-64 letters, digits, _ . -")
    cmd.add_argument("--url", required=True, help="http:// or https:// URL the actions go to")
    cmd.add_argument(
        "--secret",
        required=True,
        metavar="whsec_...|-",
        help="the signing secret, whsec_ then base64 of 24-128 bytes; - reads it "
        "from stdin (kept out of the shell's history and ps)",
    )
    cmd.add_argument(
        "--rules",
        type=csv,
        default=[],
        metavar="A,B,...",
        help="deliver only these rules' actions (default: every rule's)",
    )
    cmd.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        help="seconds each phase of a POST may take (connect, send, reply)",
    )
    cmd.add_argument(
        "--from-start",
        action="store_true",
        help="also deliver the actions already in the streams (default: only "
        "those committed from now on)",
    )
    cmd.add_argument(
        "--replace",
        action="store_true",
        help="replace an endpoint of that name (what it was delivered stays)",
    )


def add_deliver_flags(cmd: argparse.ArgumentParser) -> None:
    _settings_flags(cmd, DELIVER_FLAGS)


def _client(args: argparse.Namespace) -> tuple[Client, Keys]:
    from worker.common.connection import connect_settings
    from worker.common.keys import Keys
    from worker.common.settings import DeliverySettings, load_settings

    settings = load_settings(args, DeliverySettings, model=None)
    return connect_settings(settings), Keys(settings.prefix)


def cmd_add(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from worker.webhooks.endpoints import Endpoint
    from worker.webhooks.store import add_endpoint

    secret = sys.stdin.readline().strip() if args.secret == "-" else args.secret
    start = "0-0" if args.from_start else f"{int(time.time() * 1000)}-0"
    try:
        endpoint = Endpoint(
            name=args.name,
            url=args.url,
            secret=secret,
            rules=tuple(args.rules),
            timeout=args.timeout,
            start=start,
        )
    except ValidationError as exc:  # said without the values: one of them is the secret
        raise ValueError(_problems(exc)) from None
    client, keys = _client(args)
    add_endpoint(client, keys, endpoint, replace=args.replace)
    shown = endpoint.shown()
    rules = ",".join(endpoint.rules) or "every rule"
    print(
        f"endpoint {endpoint.name} {'replaced' if args.replace else 'added'}: {shown['url']} "
        f"({rules}, secret {shown['secret']}, timeout {endpoint.timeout:g} s)"
    )
    return 0


def _problems(exc) -> str:
    """A pydantic error of `add`'s flags, each by its flag, never with the value given."""
    flags = {"name": "NAME", "url": "--url", "secret": "--secret", "timeout": "--timeout"}
    lines = []
    for e in exc.errors():
        field = str(e["loc"][0]) if e["loc"] else "input"
        lines.append(f"{flags.get(field, field)}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    from worker.webhooks.store import load_endpoints

    client, keys = _client(args)
    shown = [e.shown() for _, e in sorted(load_endpoints(client, keys).items())]
    if args.json:
        print(json.dumps(shown))
        return 0
    header = ("name", "url", "rules", "timeout", "secret")
    rows = [
        (
            str(e["name"]),
            str(e["url"]),
            ",".join(e["rules"]) or "(all)",  # type: ignore[arg-type]
            f"{e['timeout']:g}s",
            str(e["secret"]),
        )
        for e in shown
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(no endpoints: `intentstream webhooks add NAME --url URL --secret whsec_...`)")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    from worker.webhooks.store import remove_endpoint

    client, keys = _client(args)
    recorded = client.hget(keys.config, "partitions")
    groups = remove_endpoint(client, keys, args.name, int(recorded) if recorded else 1)
    print(f"endpoint {args.name} removed ({groups} consumer groups, its dead letters)")
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    from worker.webhooks.payload import ping
    from worker.webhooks.post import post_once
    from worker.webhooks.store import get_endpoint

    client, keys = _client(args)
    endpoint = get_endpoint(client, keys, args.name)
    delivery = ping(endpoint.name)
    started = time.monotonic()
    attempt = post_once(endpoint, delivery)
    ms = (time.monotonic() - started) * 1000
    print(
        f"{endpoint.name}: {attempt.describe()} in {ms:.0f} ms (webhook-id {delivery.webhook_id})"
    )
    return 0 if attempt.ok else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from worker.rules.definition import parse_duration
    from worker.webhooks.deadletters import drop_dead_letter, read_dead_letters
    from worker.webhooks.post import EndpointClient
    from worker.webhooks.store import get_endpoint

    since_ms = 0
    if args.since:
        since_ms = int(time.time() * 1000) - parse_duration(args.since)
    client, keys = _client(args)
    endpoint = get_endpoint(client, keys, args.name)
    delivered = failed = 0
    with EndpointClient(endpoint, 1) as http:
        for dead in read_dead_letters(client, keys, endpoint.name, since_ms, count=100_000):
            attempt = http.post_all([dead.delivery])[0]
            if attempt.ok:
                drop_dead_letter(client, keys, endpoint.name, dead.entry_id)
                delivered += 1
            else:
                failed += 1
                print(f"{dead.delivery.webhook_id}: {attempt.describe()} (kept)")
    print(f"{endpoint.name}: {delivered} delivered, {failed} failed and kept")
    return 0 if failed == 0 else 1


def cmd_deliver(args: argparse.Namespace) -> int:
    from worker.commands.deliver import run_deliver

    return run_deliver(args)
