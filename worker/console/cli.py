"""`intentstream console`: its flags, and the server (uvicorn) on 127.0.0.1 by default."""

from __future__ import annotations

import argparse

from worker.commands.args import port_number, positive_int

CONSOLE_SETTINGS = ["redis_url", "cluster", "prefix", "socket_timeout", "partitions", "group",
                    "max_model_bytes", "batch_size", "history_events", "event_id_window",
                    "resend_window_seconds", "max_ts_skew_ms"]  # fmt: skip
_EPILOG = """\
The console serves nothing without a token: set INTENTSTREAM_CONSOLE_TOKEN (editor: may set
rules and promote models) and/or INTENTSTREAM_CONSOLE_VIEWER_TOKEN (read only), or the same
names with _FILE naming a file that holds the token. docs/console.md has the rest.

examples:
  INTENTSTREAM_CONSOLE_TOKEN=$(openssl rand -hex 24) intentstream console
  intentstream console --host 0.0.0.0 --port 9200 --tls-cert cert.pem --tls-key key.pem"""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The `console` sub-command's flags (its parser and help: worker/commands/cli.py)."""
    from worker.common.settings import add_setting_flags

    parser.epilog = _EPILOG
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only)",
    )
    parser.add_argument(
        "--port", type=port_number, default=9200, help="port to listen on (default: 9200)"
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=None,
        help="serve HTTPS with this certificate (PEM); cookies are then Secure",
    )
    parser.add_argument(
        "--tls-key", metavar="FILE", default=None, help="the private key of --tls-cert (PEM)"
    )
    parser.add_argument(
        "--backtest-events",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="a rule's backtest replays the newest N retained events of each "
        "partition (default: 100000)",
    )
    add_setting_flags(parser, CONSOLE_SETTINGS)
    parser.set_defaults(func=cmd_console)


def cmd_console(args: argparse.Namespace) -> int:
    """Serve the console until Ctrl-C or SIGTERM; exit 2 on a bad setting or no token."""
    import uvicorn

    from worker.common.settings import SettingsError, load_settings
    from worker.console.app import build_app
    from worker.console.context import make_console
    from worker.console.tokens import TokenError, load_tokens

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SettingsError("give --tls-cert and --tls-key together")
    try:
        tokens = load_tokens()
    except TokenError as exc:
        raise SettingsError(str(exc)) from None
    settings = load_settings(args, model=None)
    app = build_app(make_console(settings, tokens, args.backtest_events))
    scheme = "https" if args.tls_cert else "http"
    print(
        f"intentstream console on {scheme}://{args.host}:{args.port}/ (sign in at /login)",
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        log_level="warning",
        server_header=False,
        access_log=False,
    )
    return 0
