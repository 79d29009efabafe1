"""The worker's metrics registry: process and runtime collectors, intentstream_build_info, and
intentstream_batch_entries beside the contract's intentstream_batch_size; checked on a live
worker's /metrics, parsed with prometheus_client's text parser."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy_tools import scrape_text
from tests.workers import WorkerProcess, wait_for
from worker.common.local_redis import free_port
from worker.engine.adapters.metrics import WorkerMetrics
from worker.producers.publisher import publish

# What a registry of one's own lacks and the default registry has: RSS, CPU, GC.
RUNTIME_SAMPLES = {
    "process_resident_memory_bytes", "process_virtual_memory_bytes",
    "process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds",
    "python_info", "python_gc_objects_collected_total", "python_gc_collections_total",
}  # fmt: skip


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram_samples(family, name: str) -> list[tuple[str, dict, float]]:
    """(sample suffix, labels, value) of a histogram family, `_created` left out."""
    return sorted(
        ((s.name[len(name) :], sorted(s.labels.items()), s.value) for s in family.samples
         if not s.name.endswith("_created")),
    )  # fmt: skip


def test_batch_size_is_batch_entries_under_its_first_name():
    m = WorkerMetrics()
    for n in (1, 3, 300, 9000, 5):
        m.batch_entries.observe(n)
    assert m.value("intentstream_batch_entries_count") == 5
    assert m.value("intentstream_batch_size_count") == 5
    for le in ("1.0", "4.0", "512.0", "8192.0", "+Inf"):
        assert m.value("intentstream_batch_size_bucket", le=le) == m.value(
            "intentstream_batch_entries_bucket", le=le
        )
    assert m.value("intentstream_batch_size_sum") == 1 + 3 + 300 + 9000 + 5


@pytest.mark.integration
def test_a_live_worker_exports_runtime_metrics_build_info_and_batch_entries(
    redis_server, golden_path, tmp_path
):
    port = free_port()
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "worker.log", "--metrics-port", str(port)
    ).start()
    try:
        client = redis.Redis.from_url(redis_server.url)
        publish(client, [{"user_id": f"u{i}", "type": "view"} for i in range(20)])
        wait_for(
            lambda: 'intentstream_events_total{outcome="scored"} 20.0' in scrape_text(port),
            60,
            "20 events scored",
        )
        text = scrape_text(port)
    finally:
        worker.terminate()
    found = families(text)
    samples = {s.name: s for f in found.values() for s in f.samples}
    assert set(samples) >= RUNTIME_SAMPLES, RUNTIME_SAMPLES - set(samples)
    assert samples["process_resident_memory_bytes"].value > 10e6
    assert samples["process_cpu_seconds_total"].value > 0

    (info,) = found["intentstream_build_info"].samples
    assert info.value == 1
    assert info.labels["version"] == importlib.metadata.version("intentstream")
    assert info.labels["python"] == platform.python_version()
    assert info.labels["numba"] == importlib.metadata.version("numba")
    assert info.labels["numpy"] == importlib.metadata.version("numpy")

    entries, size = found["intentstream_batch_entries"], found["intentstream_batch_size"]
    assert entries.type == size.type == "histogram"
    assert "intentstream_batch_entries" in size.documentation
    assert histogram_samples(size, "intentstream_batch_size") == histogram_samples(
        entries, "intentstream_batch_entries"
    )
    assert samples["intentstream_batch_entries_sum"].value == 20


def test_the_endpoint_is_prometheus_clients_exposition_with_head_on_every_path():
    import gzip
    import urllib.error
    import urllib.request

    from worker.engine.adapters.metrics import Health, serve_metrics

    m, health = WorkerMetrics(), Health()
    m.batch_entries.observe(3)
    port = free_port()
    server = serve_metrics(m, health, "127.0.0.1", port)

    def fetch(path: str, method: str = "GET", **headers: str):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                         headers=headers)  # fmt: skip
        try:
            reply = urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as exc:
            reply = exc
        with reply:
            return reply.status, reply.headers, reply.read()

    try:
        status, headers, text = fetch("/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "intentstream_batch_entries_count 1.0" in text.decode()
        assert "# EOF" not in text.decode()
        # OpenMetrics when the scraper asks for it (Prometheus does), ending in # EOF
        status, headers, om = fetch("/metrics", Accept="application/openmetrics-text; "
                                    "version=1.0.0; charset=utf-8")  # fmt: skip
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.decode().endswith("# EOF\n")
        # gzip when allowed
        status, headers, packed = fetch("/metrics", **{"Accept-Encoding": "gzip"})
        assert headers["Content-Encoding"] == "gzip"
        assert "intentstream_batch_entries_count 1.0" in gzip.decompress(packed).decode()
        # name[] keeps only the families asked for
        _, _, some = fetch("/metrics?name[]=intentstream_build_info")
        names = {f.name for f in text_string_to_metric_families(some.decode())}
        assert names == {"intentstream_build_info"}
        # HEAD: the GET's status and headers, no body (501 before)
        for path, code in (("/metrics", 200), ("/healthz", 200), ("/readyz", 503), ("/x", 404)):
            status, headers, body = fetch(path, method="HEAD")
            assert (status, body) == (code, b""), path
            assert int(headers["Content-Length"]) > 0, path
        assert fetch("/healthz")[2] == b"ok\n"
    finally:
        server.shutdown()
        server.server_close()
