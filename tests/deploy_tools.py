"""Helpers of the deploy tests: paths, the tools they run, a live worker's metrics."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
# scripts/deploy_tools.sh unpacks Debian's prometheus package here (promtool, prometheus)
TOOLS_BIN = ROOT / ".cache" / "deploy-tools" / "usr" / "bin"


def _tool(beside: Path, name: str, hint: str) -> str:
    """`name` from the directory `beside`, else from PATH; RuntimeError with `hint`."""
    if (beside / name).exists():
        return str(beside / name)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: {hint}")
    return found


def venv_tool(name: str) -> str:
    """A console script installed beside this interpreter (hadolint, check-jsonschema, ...)."""
    return _tool(Path(sys.executable).parent, name, "pip install -e '.[test]'")


def prometheus_tool(name: str) -> str:
    """promtool or prometheus: from scripts/deploy_tools.sh's cache, else PATH."""
    return _tool(TOOLS_BIN, name, "run `bash scripts/deploy_tools.sh` (CI does)")


def run(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, capturing text output."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def scrape_text(port: int) -> str:
    """The worker's /metrics page."""
    url = f"http://127.0.0.1:{port}/metrics"
    return urllib.request.urlopen(url, timeout=30).read().decode()


def metric_names(text: str) -> set[str]:
    """Every sample name of a metrics page (with _total, _bucket, ... suffixes), parsed with
    prometheus_client's parser."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without INTENTSTREAM_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTSTREAM_")}
    env.update(extra)
    return env
