"""`intentstream bench --webhooks`: one `intentstream deliver` process against a keep-alive
receiver process (worker/bench/receiver.py) on a private Redis: deliveries per second from a
backlog, and the delay from each action's commit to its arrival at a fixed rate."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from worker.common.cli_help import HelpFormatter
from worker.common.local_redis import LocalRedis, free_port

ACTION = {"user_id": "user-123", "rule": "coupon", "score": "0.8125", "event_id": "ev-123",
          "ts": "1764979200000", "model": "1",
          "reasons": '[{"type":"add_to_cart","ts":1764979200000,"delta":0.3},'
                     '{"type":"view","ts":1764979100000,"delta":0.1}]'}  # fmt: skip
SECRET = "whsec_" + "A" * 43 + "="


def machine() -> str:
    """The CPU, its count and the load: what the figures depend on."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        model = names[0] if names else model
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{model}, {os.cpu_count()} CPUs, load {load:.1f}"


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Run:
    """A private Redis, the receiver, an endpoint; the deliverer started on demand."""

    def __init__(self, senders: int, connections: int | None, exe: str | None) -> None:
        self.senders, self.connections, self.port = senders, connections, free_port()
        self.exe = exe or str(Path(sys.executable).parent / "intentstream")
        self.redis = LocalRedis().start()
        self.receiver = subprocess.Popen([sys.executable, "-m", "worker.bench.receiver",
                                          str(self.port)])  # fmt: skip
        self.client = self.redis.client()
        self.deliverer: subprocess.Popen | None = None
        self._cli("webhooks", "add", "bench", "--url", f"http://127.0.0.1:{self.port}/",
                  "--secret", SECRET, "--from-start")  # fmt: skip

    def _cli(self, *args: str) -> None:
        exe = str(Path(sys.executable).parent / "intentstream")
        subprocess.run([exe, *args, "--redis-url", self.redis.url], check=True,
                       capture_output=True)  # fmt: skip

    def start_deliverer(self) -> None:
        more = [] if self.connections is None else ["--webhook-connections", str(self.connections)]
        self.deliverer = subprocess.Popen(
            [self.exe, "deliver", "--redis-url", self.redis.url, "--metrics-port", "0",
             "--webhook-senders", str(self.senders), "--log-format", "json", *more],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def add(self, n: int) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in range(n):
            pipe.xadd("intentstream:actions:{0}", ACTION)
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()

    def received(self, path: str = "/") -> dict:
        for _ in range(200):
            try:
                url = f"http://127.0.0.1:{self.port}{path}"
                with urllib.request.urlopen(url, timeout=30) as r:
                    return json.load(r)
            except OSError:  # the receiver still starting
                time.sleep(0.05)
        raise RuntimeError("the benchmark's receiver does not answer")

    def wait_count(self, n: int) -> None:
        while self.received()["count"] < n:
            time.sleep(0.05)

    def close(self) -> None:
        if self.deliverer is not None:
            self.deliverer.send_signal(signal.SIGTERM)
            self.deliverer.wait(60)
        self.receiver.kill()
        self.receiver.wait()
        self.redis.close()


def throughput(actions: int, run: _Run) -> str:
    """A backlog of `actions` added at once to a running, warmed-up deliverer: deliveries/s
    from the add to the last arrival (the receiver's clock), CPU per delivery. (Timed from
    the first arrival of a backlog added before the start, a fast deliverer could deliver
    it all before the first count was read: nothing left to time.)"""
    try:
        run.start_deliverer()
        run.add(1)
        run.wait_count(1)  # up and warm: its start is not the backlog's time
        pids = (run.deliverer.pid, run.receiver.pid)
        cpu0 = [cpu_seconds(pid) for pid in pids]
        start = time.monotonic()
        run.add(actions)
        run.wait_count(actions + 1)
        seconds = run.received("/delays")["last"] - start
        cpu = [(cpu_seconds(pid) - c) / actions for pid, c in zip(pids, cpu0, strict=True)]
    finally:
        run.close()
    return (f"backlog of {actions}: {actions / seconds:,.0f} deliveries/s, "
            f"deliverer CPU {cpu[0] * 1e6:,.0f} us per delivery "
            f"(receiver {cpu[1] * 1e6:,.0f} us)")  # fmt: skip


def latency(rate: float, seconds: float, run: _Run) -> str:
    try:
        run.start_deliverer()
        run.add(1)
        run.wait_count(1)  # the deliverer is up and its group read
        start, sent = time.monotonic(), 0
        total = int(rate * seconds)
        while sent < total:
            due = min(int((time.monotonic() - start) * rate), total)
            run.add(due - sent)
            sent = due
            time.sleep(0.002)
        run.wait_count(sent + 1)
        delays = sorted(run.received("/delays")["delays_ms"][1:])
    finally:
        run.close()

    def q(f: float) -> float:
        return delays[min(len(delays) - 1, int(f * len(delays)))]

    return (f"{rate:,.0f} actions/s for {seconds:g} s ({len(delays)}): commit to arrival "
            f"p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {delays[-1]:.1f} ms")  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="intentstream bench --webhooks", description=__doc__,
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--actions", type=int, default=20_000, help="backlog delivered for the rate")
    p.add_argument("--senders", type=int, default=2, help="the deliverer's --webhook-senders")
    p.add_argument("--connections", type=int, help="the deliverer's --webhook-connections")
    p.add_argument("--exe", help="the intentstream to run as the deliverer (another build's, "
                   "for a before/after in one run; default this one)")  # fmt: skip
    p.add_argument("--rate", type=float, default=1000.0, help="actions/s for the latency")
    p.add_argument("--seconds", type=float, default=10.0, help="how long the fixed rate runs")
    args = p.parse_args(argv)
    print(f"machine: {machine()}")
    print(throughput(args.actions, _Run(args.senders, args.connections, args.exe)))
    print(latency(args.rate, args.seconds, _Run(args.senders, args.connections, args.exe)))
    return 0
