"""Render the alert rules' runbook links for where your copy of docs/deploy.md is served.

Every rule's `runbook_url` annotation is `<base>#<the runbook's heading anchor>`. The committed
alerts.yml and alerts_test.yml are rendered for DEFAULT_BASE, a placeholder (this project has no
canonical public address); render both for yours, e.g. your Git forge's view of the file:

    python deploy/prometheus/render_alerts.py --out /etc/prometheus \\
        --base https://git.example.org/ops/intentstream/blob/main/docs/deploy.md
    promtool test rules /etc/prometheus/alerts_test.yml

The base is set here and nowhere else; only the `runbook_url:` lines change.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_BASE = "https://intentstream.example/docs/deploy.md"
FILES = ("alerts.yml", "alerts_test.yml")
# `runbook_url: "<base>#<anchor>"`, in the rules and in the unit tests' expected annotations
RUNBOOK_URL = re.compile(r'^(\s*runbook_url: )"[^"#]*#([^"]+)"$', re.M)


def check_base(base: str) -> str:
    if not re.fullmatch(r"https?://[^\s\"#]+", base):
        raise ValueError(f"not an http(s) URL without a fragment: {base!r}")
    return base


def render(text: str, base: str) -> str:
    """`text` with every runbook_url's base replaced by `base` (anchors kept)."""
    check_base(base)
    return RUNBOOK_URL.sub(lambda m: f'{m[1]}"{base}#{m[2]}"', text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"default: {DEFAULT_BASE}")
    parser.add_argument("--out", type=Path, required=True,
                        help="directory to write alerts.yml and alerts_test.yml to")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        check_base(args.base)
    except ValueError as exc:
        parser.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (args.out / name).write_text(render((HERE / name).read_text(), args.base))
        print(args.out / name, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
