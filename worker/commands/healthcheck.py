"""The `intentstream healthcheck` command: exit 0 only when a worker's main loop went round
recently, as its own /healthz says (for a container HEALTHCHECK, where there is no curl)."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request

from worker.common.settings import SettingsError, add_setting_flags, load_settings

# A worker bound to every address is reached on loopback from inside its own container.
_ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def healthz_url(host: str, port: int) -> str:
    """The /healthz URL of a worker serving metrics on host:port."""
    host = _ANY_ADDRESS.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/healthz"


def check(url: str, timeout: float) -> tuple[bool, str]:
    """GET url: (True, body) on HTTP 200, else (False, why)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status == 200, reply.read(200).decode(errors="replace").strip()
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read(200).decode(errors='replace').strip()}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"cannot reach {url}: {reason}"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the `healthcheck` sub-command."""
    hc = sub.add_parser(
        "healthcheck",
        help="exit 0 if the local worker's main loop is alive (its /healthz), else 1",
    )
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
    ok, detail = check(url, args.timeout)
    print(f"{'healthy' if ok else 'unhealthy'}: {detail}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1
