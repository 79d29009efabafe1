"""CPU of one container health check (`intentstream healthcheck`, answered by the probe)
against the same check through the full CLI and a bare Python start, each against a local
/healthz, rounds alternated, medians of user+sys CPU per run.

    .venv/bin/python scripts/healthcheck_cpu.py [--rounds 21] [--python PYTHON]

--python: a Python with intentstream installed as in the image (not editable: an editable
install's import hook costs ~40 ms at every start); default this one. Each command runs
what the console script runs: `worker.commands.entry.main`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


def child_cpu(argv: list[str], env: dict[str, str]) -> float:
    """User plus system CPU seconds of one run of argv."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {**os.environ, "INTENTSTREAM_METRICS_PORT": str(server.server_address[1])}
    console = "import sys; from worker.commands.{} import main; sys.exit(main(['healthcheck']))"
    commands = {
        "intentstream healthcheck": [args.python, "-I", "-c", console.format("entry")],
        "the same through the full CLI": [args.python, "-I", "-c", console.format("cli")],
        "python -I -c pass": [args.python, "-I", "-c", "pass"],
    }
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            cpu[name].append(child_cpu(argv, env))
    server.shutdown()
    for name, runs in cpu.items():
        print(f"{name:36s} median {statistics.median(runs) * 1000:7.1f} ms CPU "
              f"(min {min(runs) * 1000:.1f}, max {max(runs) * 1000:.1f})")  # fmt: skip
    print("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
