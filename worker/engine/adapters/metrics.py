"""Prometheus metrics (docs/contract.md, Metrics) and the HTTP endpoint serving them with
/healthz and /readyz.

Event latency is observed a batch at a time (`BatchHistogram`, adapters/histograms.py): one
numpy bucket count per batch instead of one Python call per event.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import sys
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)

from worker.engine.adapters.histograms import BatchHistogram, RenamedHistogram

log = logging.getLogger("intentstream.metrics")

# 0.25 ms to 10 s, in base units (seconds).
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# intentstream_events_total's outcomes, and those of them whose entry went to a dead-letter
# stream (the alert rules and the dashboard select exactly these: test_deploy_dashboard.py).
EVENT_OUTCOMES = ("scored", "deadletter", "duplicate", "misrouted", "lost")
DEAD_LETTER_OUTCOMES = ("deadletter", "misrouted")
# intentstream_events_lost_total's causes (adapters/losses.py)
LOSS_CAUSES = ("trimmed", "deleted")
# Distributions whose version intentstream_build_info reports (read from their metadata:
# nothing is imported for it).
BUILD_INFO_DISTRIBUTIONS = {
    "version": "intentstream",
    "numba": "numba",
    "numpy": "numpy",
    "redis_py": "redis",
    "prometheus_client": "prometheus-client",
}


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_labels() -> dict[str, str]:
    """intentstream_build_info's labels: this package's version, the Python and the
    libraries the scores depend on."""
    labels = {k: _distribution_version(d) for k, d in BUILD_INFO_DISTRIBUTIONS.items()}
    labels["python"] = platform.python_version()
    labels["python_implementation"] = platform.python_implementation()
    return labels


class WorkerMetrics:
    """Every metric the worker exports, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # process_* (RSS, CPU, open fds), python_info, python_gc_*: what the default
        # registry has and a registry of one's own lacks
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.build_info = Gauge(
            "intentstream_build_info",
            "Always 1; its labels: the intentstream version, the Python and the versions of "
            "the libraries that compute the scores.",
            list(build_labels()),
            registry=r,
        )
        self.build_info.labels(**build_labels()).set(1)
        self.events = Counter(
            "intentstream_events",
            "Stream entries handled, by outcome: scored, deadletter, duplicate (already "
            "applied, or a producer's retry of an applied event_id: acknowledged only), "
            "misrouted (a user of another partition: dead-lettered), lost (deleted before it "
            "was read).",
            ["outcome"],
            registry=r,
        )
        self.latency = BatchHistogram(
            "intentstream_event_latency_seconds",
            "Time from an entry's id (its arrival in Redis) to the commit of its score.",
            LATENCY_BUCKETS,
        )
        r.register(self.latency)
        self.batch_seconds = Histogram(
            "intentstream_batch_seconds",
            "Time spent per batch, by stage: read, parse, state, model, commit.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_entries = Histogram(
            "intentstream_batch_entries",
            "Entries per processed batch.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        r.register(
            RenamedHistogram(
                "intentstream_batch_size",
                "The same as intentstream_batch_entries (entries per processed batch), under "
                "the contract's first name, kept for existing queries.",
                self.batch_entries,
            )
        )
        self.lag = Gauge(
            "intentstream_lag_entries",
            "Entries in the partition's stream not yet delivered to the group (counted when "
            "XINFO GROUPS' lag is nil or contradicted; NaN when unknown).",
            ["partition"],
            registry=r,
        )
        self.pending = Gauge(
            "intentstream_pending_entries",
            "Entries delivered to the group and not yet committed (after the position).",
            ["partition"],
            registry=r,
        )
        self.model_version = Gauge(
            "intentstream_model_version",
            "Version of the model in use (its registry number; 0 for an unregistered file).",
            registry=r,
        )
        self.shadow_version = Gauge(
            "intentstream_shadow_model_version",
            "Version of the shadow model scoring beside the current one (0 = none).",
            registry=r,
        )
        self.labelled_sessions = Counter(
            "intentstream_labelled_sessions",
            "Sessions that ended labelled (positive: the model's label event came) or not "
            "(negative: the user's next event came after the session gap), per model role.",
            ["model", "outcome"],
            registry=r,
        )
        self.live_auc = Gauge(
            "intentstream_live_auc",
            "ROC AUC of the last score before each session's outcome, over the latest "
            "10,000 labelled sessions, per model role (NaN until both outcomes are seen).",
            ["model"],
            registry=r,
        )
        self.model_reloads = Counter(
            "intentstream_model_reloads",
            "Model swaps, by result: loaded, rejected.",
            ["result"],
            registry=r,
        )
        self.input_values = Counter(
            "intentstream_input_values",
            "Declared-input values of scored events that were missing or unusable (bad), by "
            "input: scored with the input's learned default, never dead-lettered.",
            ["input", "outcome"],
            registry=r,
        )
        self.actions = Counter(
            "intentstream_actions",
            "Actions written by the intent rules (the current model's scores), by rule.",
            ["rule"],
            registry=r,
        )
        self.shadow_actions = Counter(
            "intentstream_shadow_actions",
            "Actions the shadow model's scores would have fired (not written), by rule.",
            ["rule"],
            registry=r,
        )
        self.rules_version = Gauge(
            "intentstream_rules_version",
            "Version of the intent rule set in force (0 = none ever set).",
            registry=r,
        )
        self.rules_reloads = Counter(
            "intentstream_rules_reloads",
            "Intent rule set changes, by result: loaded, rejected (the old set stays).",
            ["result"],
            registry=r,
        )
        self.redis_errors = Counter(
            "intentstream_redis_errors",
            "Redis connection errors, timeouts and unexpected replies.",
            registry=r,
        )
        self.last_processed = Gauge(
            "intentstream_last_processed_timestamp_seconds",
            "Unix time of the last committed batch.",
            registry=r,
        )
        self.unknown_types = Counter(
            "intentstream_unknown_type_events",
            "Events scored with the reserved unknown-type row.",
            registry=r,
        )
        self.resend_overflow = Counter(
            "intentstream_resend_window_overflow",
            "Producer event ids a user's resend memory forgot before the resend window "
            "ended (more than event-id-window of them within resend-window-seconds): a "
            "resend of those would be scored again.",
            registry=r,
        )
        self.state_resets = Counter(
            "intentstream_state_resets",
            "User states read from Redis that could not be used, by reason: replayed "
            "(rebuilt from the user's recent events), model (another model's state and no "
            "recent events: restarted from zero), invalid (wrong size, non-finite values or "
            "a bad field: restarted from zero), wrong_type (the key holds another type: "
            "replaced, restarted from zero).",
            ["reason"],
            registry=r,
        )
        self.commit_retries = Counter(
            "intentstream_commit_retries",
            "Commits that applied nothing, by reason (see adapters/commit.py).",
            ["reason"],
            registry=r,
        )
        self.events_lost = Counter(
            "intentstream_events_lost",
            "Entries removed from a partition's stream before they were applied, by cause: "
            "`trimmed` (XTRIM, XADD MAXLEN/MINID), `deleted` (XDEL); counted from Redis's "
            "stream counters at the maintenance tick (adapters/losses.py).",
            ["partition", "cause"],
            registry=r,
        )
        self.partition_stopped = Gauge(
            "intentstream_partition_stopped",
            "1 while a held partition is stopped by an impossible position (its acked key of "
            "another type, unparsable, or ahead of its stream): nothing of it is read until "
            "`intentstream partitions repair` (the log names the key).",
            ["partition", "reason"],
            registry=r,
        )
        self.bad_keys = Counter(
            "intentstream_bad_keys",
            "Times a partition-wide key (stream, scores, dead letters, sequence) held data "
            "of another type; that partition backs off (the log names the key), the others "
            "go on.",
            registry=r,
        )
        self.redis_memory_used = Gauge(
            "intentstream_redis_memory_used_bytes",
            "Redis used_memory (INFO memory), read at the maintenance tick.",
            registry=r,
        )
        self.redis_maxmemory = Gauge(
            "intentstream_redis_maxmemory_bytes",
            "Redis maxmemory (0 = no limit), read at the maintenance tick.",
            registry=r,
        )
        self.partitions = Gauge(
            "intentstream_partitions",
            "The partition count this worker runs with (the count in force).",
            registry=r,
        )
        self.partitions_owned = Gauge(
            "intentstream_partitions_owned",
            "Partitions whose lease this worker holds.",
            registry=r,
        )
        for outcome in EVENT_OUTCOMES:
            self.events.labels(outcome)
        for role in ("current", "shadow"):
            for outcome in ("positive", "negative"):
                self.labelled_sessions.labels(role, outcome)
        for result in ("loaded", "rejected"):
            self.model_reloads.labels(result)
        for reason in ("replayed", "model", "invalid", "wrong_type"):
            self.state_resets.labels(reason)
        for reason in ("conflict", "not_next", "behind", "not_owned", "gap", "bad_key"):
            self.commit_retries.labels(reason)

    def held_partition(self, p: int) -> None:
        """Export a held partition's loss counters at 0 and its stopped gauge at 0 (reason
        `none`): a first loss then shows as an increase, and a series exists to alert on."""
        for cause in LOSS_CAUSES:
            self.events_lost.labels(str(p), cause)
        self.partition_stopped.labels(str(p), "none")

    def released_partition(self, p: int) -> None:
        """Drop the series of a partition this worker no longer holds."""
        for cause in LOSS_CAUSES:
            with suppress(KeyError):
                self.events_lost.remove(str(p), cause)
        with suppress(KeyError):
            self.partition_stopped.remove(str(p), "none")

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value by its exposition name (e.g. intentstream_events_total),
        0 when absent."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def count(self, outcome: str) -> float:
        """intentstream_events_total{outcome}, from that counter alone: `value` collects the
        whole registry, /proc reads of the process collector included (about 3% of a worker's
        CPU when a bench polled it every batch)."""
        wanted = {"outcome": outcome}
        for metric in self.events.collect():
            for sample in metric.samples:
                if sample.name == "intentstream_events_total" and sample.labels == wanted:
                    return sample.value
        return 0.0


class Health:
    """Liveness and readiness, as the main loop reports them."""

    def __init__(self, stale_after: float = 30.0) -> None:
        self.stale_after = stale_after
        self.heartbeat = time.monotonic()
        self.redis_ok = False
        self.group_ok = False
        self.model_ok = False

    def beat(self) -> None:
        self.heartbeat = time.monotonic()

    def alive(self) -> bool:
        """The main loop went round recently."""
        return time.monotonic() - self.heartbeat < self.stale_after

    def ready(self) -> bool:
        """Redis reachable, group present, model loaded."""
        return self.redis_ok and self.group_ok and self.model_ok


class _QuietServer(ThreadingHTTPServer):
    """An HTTP server whose request errors go to the log (one JSON line in json format),
    not as a traceback to stderr; a scraper that hangs up early is routine."""

    # socketserver listens with a backlog of 5: a burst of connections (scrapers, probes,
    # each served by a thread that holds the GIL a few ms) filled it and the kernel dropped
    # the next SYN, a 1-s stall for its client (every ~6th of 50 quick connections here)
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            log.debug("metrics client went away", extra={"error": repr(exc)})
        else:
            log.warning("metrics request failed", extra={"error": repr(exc)})


def serve_metrics(
    metrics: WorkerMetrics, health: Health, host: str, port: int
) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz on host:port from a daemon thread.

    /metrics is prometheus_client's own exposition (its WSGI app, `make_wsgi_app`): the
    format the scraper's Accept asks for (Prometheus text, or OpenMetrics), gzip when its
    Accept-Encoding allows it, `?name[]=...` for some families only. Every path answers HEAD
    as GET, without the body."""
    exposition = make_wsgi_app(metrics.registry)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

        def _route(self, head: bool) -> None:
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                self._metrics(query, head)
            elif path == "/healthz":
                ok = health.alive()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"main loop stalled\n", head)
            elif path == "/readyz":
                checks = {
                    "redis": health.redis_ok,
                    "group": health.group_ok,
                    "model": health.model_ok,
                }
                body = "".join(f"{k}: {'ok' if v else 'not ok'}\n" for k, v in checks.items())
                self._reply(200 if all(checks.values()) else 503, body.encode(), head)
            else:
                self._reply(404, b"try /metrics, /healthz or /readyz\n", head)

        def _metrics(self, query: str, head: bool) -> None:
            environ = {
                "REQUEST_METHOD": "GET",  # HEAD: the GET's headers, no body
                "PATH_INFO": "/metrics",
                "QUERY_STRING": query,
            }
            for name, header in (("HTTP_ACCEPT", "Accept"),
                                 ("HTTP_ACCEPT_ENCODING", "Accept-Encoding")):  # fmt: skip
                if self.headers.get(header) is not None:
                    environ[name] = self.headers[header]
            reply: list[tuple[str, list[tuple[str, str]]]] = []

            def start_response(status: str, headers: list[tuple[str, str]]) -> None:
                reply.append((status, headers))

            body = b"".join(exposition(environ, start_response))
            ((status, headers),) = reply
            self.send_response(int(status.split(" ", 1)[0]))
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _reply(self, code: int, body: bytes, head: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every few seconds would drown the worker's own log

    server = _QuietServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
