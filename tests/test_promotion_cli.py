"""One promotion gate for every way a model becomes current: `model promote` and `model
publish --promote` compare the candidate with the current model on the retained event
history (each with its own vocabulary) and refuse a worse one unless --force, saying what
they compared; with nothing to compare on they say so and promote."""

from __future__ import annotations

import redis

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from model.training.train import TrainConfig, train
from tests.conftest import run_cli
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish


def _registry_with_history(url: str, tmp_path):
    events = list(synthetic_events(6000, 300, seed=4))
    trained = train(events, TrainConfig(hidden=8, epochs=3, test_fraction=0.0)).model
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    save_model(trained, good)
    m = trained.meta
    save_model(random_model(m.event_types, 8, 1, m.features, 4, seed=9), bad)
    client = redis.Redis.from_url(url)
    publish(client, events)  # the retained history the gate reads
    return client, good, bad


def test_promote_and_publish_refuse_a_worse_model_unless_forced(redis_server, tmp_path):
    client, good, bad = _registry_with_history(redis_server.url, tmp_path)
    url = ["--redis-url", redis_server.url]
    first = run_cli("model", "publish", str(good), "--promote", *url)
    assert first.returncode == 0 and "published version 1 (current)" in first.stdout
    reg = Registry(client)

    worse = run_cli("model", "publish", str(bad), "--promote", *url, timeout=300)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "published version 2" in worse.stdout and reg.current() == "1"
    assert "gate: both models scored on the retained history's" in worse.stdout
    assert "retained-history AUC last, current version 1 -> candidate" in worse.stdout
    assert "not promoted: retained-history AUC" in worse.stdout
    assert "(--force promotes anyway)" in worse.stdout

    again = run_cli("model", "promote", "2", *url, timeout=300)
    assert again.returncode == 1 and reg.current() == "1", again.stdout + again.stderr
    forced = run_cli("model", "promote", "2", "--force", *url, timeout=300)
    assert forced.returncode == 0 and reg.current() == "2", forced.stdout + forced.stderr
    assert "not promoted" not in forced.stdout and "version 2 is current" in forced.stdout

    better = run_cli("model", "promote", "1", *url, timeout=300)  # the gate lets it through
    assert better.returncode == 0 and reg.current() == "1", better.stdout + better.stderr
    assert "retained-history AUC last, current version 2 -> candidate" in better.stdout


def test_with_no_history_to_compare_on_the_gate_says_so_and_promotes(redis_server, tmp_path):
    client, good, bad = _registry_with_history(redis_server.url, tmp_path)
    url = ["--redis-url", redis_server.url]
    assert run_cli("model", "publish", str(good), "--promote", *url).returncode == 0
    client.delete(*client.keys("intentstream:events:*"))
    out = run_cli("model", "publish", str(bad), "--promote", *url, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "nothing to compare on, promoting without a comparison" in out.stdout
    assert Registry(client).current() == "2"
    missing = run_cli("model", "promote", "9", *url)
    assert missing.returncode == 2 and "9" in missing.stderr
