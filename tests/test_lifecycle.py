"""Model lifecycle (docs/contract.md, Model artifacts and the registry): a hidden state is read
only by the model space that wrote it; any other model rebuilds it by replaying the user's
recent events of the session."""

from __future__ import annotations

import numpy as np
import pytest

from model.artifact import Model, ModelMeta
from model.random_init import random_model
from model.scoring import InMemoryScorer, ScoringModel
from tests.consumers import in_process_consumer
from tests.workers import score_entries, wait_for
from worker.common.connection import connect
from worker.engine.compute.pipeline import build_commit
from worker.engine.compute.recent import Recent, extended, pack, unpack
from worker.engine.compute.user_states import UserStates
from worker.engine.consumer import Consumer
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish

SMALL = ["view", "search", "add_to_cart", "purchase"]
LARGE = [*SMALL, "remove_from_cart", "coupon", "checkout", "wishlist"]


def continuing(model: Model, space: str) -> Model:
    """The same model, declaring that it continues `space`'s states."""
    meta = ModelMeta(**model.meta.model_dump(), state_space=space)
    return Model(meta=meta, arrays=model.arrays)


def offline(model: Model, events: list[dict]) -> np.ndarray:
    """Scores of one uninterrupted in-memory run of `model` over the events."""
    scorer = InMemoryScorer(ScoringModel(model))
    return scorer.score([e["user_id"] for e in events], [e["type"] for e in events],
                        np.array([e["ts"] for e in events]))  # fmt: skip


def run_until(consumer: Consumer, condition, what: str) -> None:
    wait_for(lambda: consumer.tick() or condition(), what=what)


def session(user: str, types: list[str], start: int = 1_700_000_000_000) -> list[dict]:
    return [{"user_id": user, "type": t, "ts": start + 1000 * i} for i, t in enumerate(types)]


@pytest.mark.parametrize("history", [32, 0])
def test_a_new_model_never_reads_another_models_state(redis_server, history):
    r = connect(redis_server.url)
    reg = Registry(r)
    v1 = random_model(SMALL, hidden=64, features=["gap"], seed=1)
    v2 = random_model(LARGE, hidden=64, features=["gap"], seed=2)  # same state size
    reg.publish_model(v1, promote=True)
    consumer = in_process_consumer(redis_server.url, history_events=history)
    before = session("alice", ["view", "search", "add_to_cart"])
    publish(r, before)
    run_until(consumer, lambda: len(score_entries(r)) == 3, "v1's scores")
    reg.publish_model(v2, promote=True)
    run_until(consumer, lambda: consumer.model.version == "2", "the swap")
    after = session("alice", ["view"], start=before[-1]["ts"] + 1000)
    publish(r, after)
    run_until(consumer, lambda: len(score_entries(r)) == 4, "v2's score")
    got = float(score_entries(r)[-1]["score"])
    resets = consumer.metrics.value
    if history:
        # rebuilt: v2 over alice's whole session, as if v2 had scored it from the start
        want = offline(v2, before + after)[-1]
        assert resets("intentstream_state_resets_total", reason="replayed") == 1
    else:
        # no history: alice restarts from zero, her gap still counted from her last event
        zero = ScoringModel(v2)
        state = np.zeros((1, *zero.state_shape), np.float32)
        last_ts = np.array([before[-1]["ts"]], np.int64)
        want = zero.advance(state, last_ts, np.zeros(1, np.int64), zero.type_indices(["view"]),
                            np.array([after[0]["ts"]]))[0]  # fmt: skip
        assert resets("intentstream_state_resets_total", reason="model") == 1
    assert abs(got - want) < 1e-6, (got, want)
    assert score_entries(r)[-1]["model"] == "2"


def test_a_model_that_continues_the_state_space_reads_the_states(redis_server):
    r = connect(redis_server.url)
    reg = Registry(r)
    v1 = random_model(SMALL, hidden=16, features=["gap"], seed=1)
    v2 = continuing(random_model(SMALL, hidden=16, features=["gap"], seed=2), "1")
    reg.publish_model(v1, promote=True)
    consumer = in_process_consumer(redis_server.url)
    events = session("u", ["view", "search"])
    publish(r, events[:1])
    run_until(consumer, lambda: len(score_entries(r)) == 1, "v1's score")
    h1 = np.frombuffer(r.hget("intentstream:state:{0}:u", "h"), "<f4").copy()
    reg.publish_model(v2, promote=True)
    run_until(consumer, lambda: consumer.model.version == "2", "the swap")
    publish(r, events[1:])
    run_until(consumer, lambda: len(score_entries(r)) == 2, "v2's score")
    m2 = ScoringModel(v2)
    state = h1.reshape(1, *m2.state_shape).copy()
    want = m2.advance(state, np.array([events[0]["ts"]]), np.zeros(1, np.int64),
                      m2.type_indices(["search"]), np.array([events[1]["ts"]]))[0]  # fmt: skip
    assert abs(float(score_entries(r)[-1]["score"]) - want) < 1e-6
    assert consumer.metrics.value("intentstream_state_resets_total", reason="replayed") == 0


def test_a_long_session_replays_its_last_history_events(redis_server):
    r = connect(redis_server.url)
    reg = Registry(r)
    v1 = random_model(SMALL, hidden=8, seed=1)  # no gap feature: a replay from the middle of
    v2 = random_model(LARGE, hidden=8, seed=2)  # a session equals a fresh start there
    reg.publish_model(v1, promote=True)
    consumer = in_process_consumer(redis_server.url, history_events=4)
    before = session("bob", ["view", "search"] * 5)
    publish(r, before)
    run_until(consumer, lambda: len(score_entries(r)) == 10, "v1's scores")
    reg.publish_model(v2, promote=True)
    run_until(consumer, lambda: consumer.model.version == "2", "the swap")
    after = session("bob", ["add_to_cart"], start=before[-1]["ts"] + 1000)
    publish(r, after)
    run_until(consumer, lambda: len(score_entries(r)) == 11, "v2's score")
    want = offline(v2, before[-4:] + after)[-1]
    assert abs(float(score_entries(r)[-1]["score"]) - want) < 1e-6


def test_recent_events_pack_and_cut_at_session_gaps():
    recent = Recent.of(-1, [1000, 2000], ["view", "ü-type"])
    assert unpack(pack(recent)) == recent
    assert unpack(b"garbage") == Recent() and unpack(None) == Recent()
    grown = extended(recent, [3000, 9_000_000], ["a", "b"], keep=32, session_gap_ms=60_000)
    assert grown == Recent.of(3000, [9_000_000], ["b"])  # a new session started at b
    capped = extended(recent, [3000, 4000], ["a", "b"], keep=3, session_gap_ms=0)
    assert capped == Recent.of(1000, [2000, 3000, 4000], ["ü-type", "a", "b"])


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_the_pipeline_replays_before_the_batch_and_emits_no_scores_for_it(cell):
    from worker.engine.compute.batch import parse_batch

    model = ScoringModel(random_model(SMALL, hidden=8, features=["gap"], seed=3, cell=cell),
                         version="9")  # fmt: skip
    states = UserStates.empty(["u"], model.state_shape)
    states.recent[0] = pack(Recent.of(500, [1000, 2000], ["view", "search"]))
    states.replay.append(0)
    states.h[0] = 7.0  # another model's state: never read
    batch = parse_batch(0, [[b"3000-0", [b"user_id", b"u", b"type", b"add_to_cart",
                                         b"ts", b"3000"]]])  # fmt: skip
    c = build_commit(batch, states, model, history_events=32)
    full = [{"user_id": "u", "type": t, "ts": ts} for t, ts in
            [("view", 1000), ("search", 2000), ("add_to_cart", 3000)]]  # fmt: skip
    # the offline run starts fresh at 1000; the replay measures 1000's gap from 500
    scorer = InMemoryScorer(model)
    scorer.score(["u"], ["x"], np.array([500]))  # gives u a previous event at 500 ...
    scorer._state["u"][:] = 0.0  # ... and a zero state, as the replay starts
    want = scorer.score(["u"] * 3, [e["type"] for e in full], np.array([e["ts"] for e in full]))
    assert len(c.scores) == 1 and abs(float(c.scores[0]) - want[-1]) < 1e-6
    assert unpack(c.recent[0]) == Recent.of(500, [1000, 2000, 3000],
                                            ["view", "search", "add_to_cart"])  # fmt: skip


@pytest.mark.parametrize("shadow_cell", ["rnn", "lstm"])  # an LSTM's state: (L, 2H), h then c
def test_a_shadow_model_scores_like_alone_and_its_promotion_keeps_its_states(
    redis_server, shadow_cell
):
    r = connect(redis_server.url)
    reg = Registry(r)
    v1 = random_model(SMALL, hidden=16, features=["gap"], seed=1)
    v2 = random_model(LARGE, hidden=32, layers=2, features=["gap"], seed=2, cell=shadow_cell)
    reg.publish_model(v1, promote=True)
    reg.publish_model(v2)
    consumer = in_process_consumer(redis_server.url)
    events = [e for u in ("a", "b", "c") for e in session(u, ["view", "search", "add_to_cart"])]
    events.sort(key=lambda e: e["ts"])
    publish(r, events[:3])  # before the shadow starts: its states are replayed from history
    run_until(consumer, lambda: len(score_entries(r)) == 3, "v1's first scores")
    reg.set_shadow("2")
    run_until(consumer, lambda: consumer.shadow is not None, "the shadow to start")
    publish(r, events[3:])
    run_until(consumer, lambda: len(score_entries(r)) == len(events), "all scores")
    rows = score_entries(r)
    np.testing.assert_allclose([float(x["score"]) for x in rows], offline(v1, events), atol=1e-6)
    shadowed = rows[3:]
    assert {x["shadow_model"] for x in shadowed} == {"2"}
    np.testing.assert_allclose([float(x["shadow_score"]) for x in shadowed],
                               offline(v2, events)[3:], atol=1e-6)  # fmt: skip

    reg.promote("2")  # the challenger wins: its states are current at once
    # v2 is handed over without a shadow even when the loader checks between promote's two
    # writes (test_model_loading.py, a promotion seen half done)
    run_until(consumer, lambda: consumer.model.version == "2", "the promotion")
    assert reg.shadow() is None and consumer.shadow is None
    more = [{"user_id": u, "type": "view", "ts": events[-1]["ts"] + 1000} for u in "abc"]
    publish(r, more)
    run_until(consumer, lambda: len(score_entries(r)) == len(events) + 3, "v2's scores")
    np.testing.assert_allclose([float(x["score"]) for x in score_entries(r)[-3:]],
                               offline(v2, events + more)[-3:], atol=1e-6)  # fmt: skip
    assert consumer.metrics.value("intentstream_state_resets_total", reason="replayed") == 0


@pytest.mark.parametrize("shadow_cell", ["rnn", "lstm"])
def test_a_shadow_scores_like_alone_from_cached_and_ahead_computed_states(
    redis_server, shadow_cell
):
    """With a shadow running, states come from the cache and from batches computed while the
    commit before them ran, for both models; sequence bumps between rounds refuse some of
    those batches. Both score columns equal each model run alone."""
    from model.data.synthetic import synthetic_events
    from worker.common.keys import Keys

    r = connect(redis_server.url)
    reg = Registry(r)
    types = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout",
             "purchase"]  # fmt: skip
    v1 = random_model(types, hidden=16, features=["gap"], seed=1)
    v2 = random_model(types, hidden=24, layers=2, features=["gap"], seed=2, cell=shadow_cell)
    reg.publish_model(v1, promote=True)
    reg.publish_model(v2)
    reg.set_shadow("2")
    consumer = in_process_consumer(redis_server.url, batch_size=50)
    run_until(consumer, lambda: consumer.shadow is not None, "the shadow to start")
    events = list(synthetic_events(1500, 60, seed=4))
    publish(r, events)
    used = []
    compute = consumer.flow.compute
    consumer.flow.compute = lambda batch, *a: used.append(compute(batch, *a)) or used[-1]
    ticks = 0

    def tick_and_bump() -> bool:
        nonlocal ticks
        consumer.tick()
        ticks += 1
        if ticks % 6 == 0:
            r.incr(Keys("intentstream").commit_seq(0))
        return len(score_entries(r)) == len(events)

    wait_for(tick_and_bump, what="all scores")
    assert sum(c.ahead for c in used) > 5
    rows = score_entries(r)
    np.testing.assert_allclose([float(x["score"]) for x in rows], offline(v1, events), atol=1e-5)
    np.testing.assert_allclose([float(x["shadow_score"]) for x in rows], offline(v2, events),
                               atol=1e-5)  # fmt: skip


def test_model_shadow_command(redis_server, tmp_path):
    from model.artifact import save_model
    from tests.conftest import run_cli

    save_model(random_model(SMALL, hidden=4, seed=1), tmp_path / "m.npz")
    url = ["--redis-url", redis_server.url]
    assert run_cli("model", "publish", str(tmp_path / "m.npz"), "--promote", *url).returncode == 0
    assert run_cli("model", "publish", str(tmp_path / "m.npz"), *url).returncode == 0
    on = run_cli("model", "shadow", "2", *url)
    assert on.returncode == 0 and "version 2 is the shadow" in on.stdout
    assert "shadow: 2" in run_cli("model", "shadow", *url).stdout
    assert run_cli("model", "shadow", "--off", *url).returncode == 0
    assert Registry(connect(redis_server.url)).shadow() is None
    missing = run_cli("model", "shadow", "9", *url)
    assert missing.returncode == 2 and "no model version '9'" in missing.stderr


def test_label_samples_take_the_last_score_before_the_label_or_the_sessions_end():
    from worker.engine.compute.quality import label_samples

    # user 0: a session labelled at its 3rd event; then, after a gap, one that ends unlabelled
    # (at user 0's next event, another gap later); user 1: a session still open
    events = [(0, "view", 0), (0, "cart", 1000), (0, "purchase", 2000), (0, "view", 10**7),
              (0, "view", 10**7 + 1000), (1, "view", 0), (0, "view", 3 * 10**7)]  # fmt: skip
    slot = np.array([e[0] for e in events])
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    got = label_samples(slot, [e[1] for e in events], np.array([e[2] for e in events]), scores,
                        np.full(2, np.nan), np.full(2, -1), [b"", b""], "purchase",
                        gap_ms=60_000)  # fmt: skip
    assert got[0].tolist() == [0.2, 0.5] and got[1].tolist() == [True, False]


def _reference_samples(slot, types, ts, scores, last_score, last_ts, labelled, label, gap_ms):
    """label_samples' definition, a Python step per event: a session's sample is its last
    score before its label, or before it ended (the next event after the gap) unlabelled."""
    prev_score, prev_ts, labelled = list(last_score), list(last_ts), set(labelled)
    out = []
    for r, name, t, s in zip(slot.tolist(), types, ts.tolist(), scores.tolist(), strict=True):
        before = prev_score[r]
        if gap_ms > 0 and prev_ts[r] >= 0 and t - prev_ts[r] > gap_ms:
            if r not in labelled and before == before:
                out.append((before, False))
            labelled.discard(r)
            before = float("nan")
        if name == label and r not in labelled:
            if before == before:
                out.append((before, True))
            labelled.add(r)
        prev_score[r] = s
        prev_ts[r] = max(prev_ts[r], t)
    return out


def test_label_samples_are_the_per_event_definitions_on_random_batches():
    from worker.engine.compute.quality import label_samples
    from worker.engine.compute.recent import extend_packed, names_of

    rng = np.random.default_rng(7)
    for _ in range(200):
        users, n = int(rng.integers(1, 6)), int(rng.integers(1, 40))
        slot = rng.integers(0, users, n)
        types = [str(x) for x in rng.choice(["view", "cart", "purchase"], n, p=[0.6, 0.3, 0.1])]
        ts = np.sort(rng.integers(0, 10**6, n))
        scores = rng.random(n).astype(np.float32)
        last_score = np.where(rng.random(users) < 0.3, np.nan, rng.random(users))
        last_ts = np.where(rng.random(users) < 0.3, -1, rng.integers(0, 10**5, users))
        had = rng.random(users) < 0.3  # the current session already had its label
        recent = [
            extend_packed(b"", [0], names_of(["purchase" if h else "view"]), 8, 0.0) for h in had
        ]
        gap = float(rng.choice([0.0, 1000.0, 50_000.5]))
        got = label_samples(slot, types, ts, scores, last_score, last_ts, recent, "purchase", gap)
        had_label = np.flatnonzero(had).tolist()
        want = _reference_samples(slot, types, ts, scores.astype(np.float64), last_score,
                                  last_ts, had_label, "purchase", gap)  # fmt: skip
        assert list(zip(got[0].tolist(), got[1].tolist(), strict=True)) == want


def test_the_rows_with_outcomes_one_by_one_are_numpys(monkeypatch):
    """A few events find the rows with a label or a session end one by one; more, by numpy:
    the same rows."""
    from worker.engine.compute import quality

    rng = np.random.default_rng(8)
    monkeypatch.setattr(quality, "FEW_EVENTS", 0)  # numpy's way at any size
    for _ in range(300):
        users, n = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        slot = rng.integers(0, users, n)
        is_label = rng.random(n) < 0.2
        ts = np.sort(rng.integers(0, 10**6, n))
        last_ts = np.where(rng.random(users) < 0.3, -1, rng.integers(0, 10**6, users))
        gap = float(rng.choice([0.0, 1000.0, 50_000.5]))
        want = quality._rows_with_outcomes(slot, is_label, ts, last_ts, gap)
        assert quality._rows_one_by_one(slot, is_label, ts, last_ts, gap) == want


def test_live_auc_of_the_current_model_is_exported(redis_server):
    from model.training.evaluate import roc_auc
    from tests.test_worker import scrape
    from worker.common.local_redis import free_port
    from worker.engine.adapters.metrics import serve_metrics

    r = connect(redis_server.url)
    reg = Registry(r)
    model = random_model(SMALL, hidden=8, features=["gap"], seed=4)
    reg.publish_model(model, promote=True)
    consumer = in_process_consumer(redis_server.url)
    port = free_port()
    serve_metrics(consumer.metrics, consumer.health, "127.0.0.1", port)
    rng = np.random.default_rng(0)
    events, t = [], 1_700_000_000_000
    for s in range(60):  # sessions 2 h apart (the gap is 30 min): each ends at the next one
        for _ in range(int(rng.integers(1, 5))):
            events.append({"user_id": f"u{s % 3}", "type": str(rng.choice(SMALL[:3])), "ts": t})
            t += 1000
        if rng.random() < 0.4:
            events.append({"user_id": f"u{s % 3}", "type": "purchase", "ts": t})
        t += 7_200_000
    publish(r, events)
    run_until(consumer, lambda: len(score_entries(r)) == len(events), "all scores")
    # expected: the same rules, applied to the offline scores
    scores = offline(model, events)
    want_s, want_l, last, labelled, prev_ts = [], [], {}, set(), {}
    for e, s in zip(events, scores, strict=True):
        u = e["user_id"]
        if u in prev_ts and e["ts"] - prev_ts[u] > 1_800_000:
            if u not in labelled and u in last:
                want_s.append(last[u])
                want_l.append(False)
            labelled.discard(u)
            last.pop(u, None)
        if e["type"] == "purchase" and u not in labelled:
            if u in last:
                want_s.append(last[u])
                want_l.append(True)
            labelled.add(u)
        last[u], prev_ts[u] = s, e["ts"]
    metrics = scrape(port)
    assert metrics[
        'intentstream_labelled_sessions_total{model="current",outcome="positive"}'
    ] == sum(want_l)
    assert metrics[
        'intentstream_labelled_sessions_total{model="current",outcome="negative"}'
    ] == len(want_l) - sum(want_l)
    assert abs(metrics['intentstream_live_auc{model="current"}'] - roc_auc(want_l, want_s)) < 1e-6


def test_model_evaluate_agrees_with_trains_validation_auc_and_fine_tuning_continues_states(
    redis_server, tmp_path
):
    import json
    import re
    import zlib

    from model.data.synthetic import synthetic_events
    from tests.conftest import NO_TEST_USERS, run_cli

    r = connect(redis_server.url)
    events = list(synthetic_events(12_000, 600, seed=8))
    publish(r, events)
    url = ["--redis-url", redis_server.url]
    # without test users (NO_TEST_USERS) the validation side is exactly the users picked below
    trained = run_cli("train", "--from-redis", *url, "--epochs", "3", "--hidden", "16",
                      "--publish", "--quiet", "--report", str(tmp_path / "rep"),
                      *NO_TEST_USERS)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    report = json.loads((tmp_path / "rep" / "report.json").read_text())

    # the validation users of train's split (seed 0, fraction 0.2), as JSON lines
    valid = [e for e in events if zlib.crc32(b"0" + e["user_id"].encode()) < 0.2 * 2**32]
    data = tmp_path / "valid.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in valid))
    out = run_cli("model", "evaluate", "1", "--data", str(data), "--json", *url)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)["1"]
    assert abs(got["auc_last"] - report["metrics"]["auc_last"]) < 1e-9
    # the report's log loss is cross-fitted (each half of the users through the map of the
    # other), evaluate's goes through the artifact's map, fitted on all of them: close
    assert abs(got["logloss_last"] - report["metrics"]["logloss_last"]) < 0.02
    assert got["label_type"] == "purchase"  # recorded by training in the meta

    tuned = run_cli("train", "--from-redis", *url, "--init-from", "1", "--epochs", "1",
                    "--publish", "--quiet", *NO_TEST_USERS)  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    assert "continues state space 1" in tuned.stdout
    meta = Registry(r).meta("2")
    assert meta["state_space"] == "1" and meta["hidden"] == 16
    both = run_cli("model", "evaluate", "1", "2", "--from-redis", "--since", "10000d", *url)
    assert both.returncode == 0, both.stderr
    lines = both.stdout.splitlines()
    assert lines[0].split()[:3] == ["model", "sessions", "positive"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "2"]
    total = re.search(r"--since 10000d: (\d+) of \1 events, (\d+) of \2 sessions \(0 fewer",
                      both.stderr)  # fmt: skip
    assert total, both.stderr  # nothing left out
    none = run_cli("model", "evaluate", "1", "--from-redis", "--since", "1s", *url)
    events, sessions = total.groups()
    assert f"--since 1s: 0 of {events} events, 0 of {sessions} sessions" in none.stderr
    bad = run_cli("model", "evaluate", "1", "--from-redis", "--since", "yesterday", *url)
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_model_evaluate_prints_calibration_and_draws_the_versions_reliability(tmp_path):
    import json
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from model.artifact import save_model, validate_model
    from model.data.synthetic import synthetic_events
    from model.training.evaluate import evaluate_model
    from model.training.sessions import sessionize
    from model.training.train import TrainConfig, train
    from tests.conftest import run_cli

    events = list(synthetic_events(12000, 600, seed=4))
    config = TrainConfig(hidden=16, epochs=3, calibration_min_sessions=50)
    calibrated = train(events, config).model
    meta = calibrated.meta.model_dump()
    meta.pop("calibration")
    raw = validate_model(ModelMeta.model_validate(meta), calibrated.arrays)
    save_model(calibrated, tmp_path / "cal.npz")
    save_model(raw, tmp_path / "raw.npz")
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    names = [str(tmp_path / "cal.npz"), str(tmp_path / "raw.npz")]

    received = []

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    gateway = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    png = tmp_path / "reliability.png"
    try:
        out = run_cli("model", "evaluate", *names, "--data", str(data), "--reliability", str(png),
                      "--pushgateway", f"127.0.0.1:{gateway.server_port}")  # fmt: skip
    finally:
        gateway.shutdown()
    assert out.returncode == 0, out.stderr
    head, *rows = out.stdout.splitlines()
    columns = ["auc_last", "logloss_last", "ece_last", "brier_last",
               "auc_all", "logloss_all", "ece_all", "brier_all"]  # fmt: skip
    assert head.split() == ["model", "sessions", "positive", *columns]
    sessions = sessionize(events, raw.meta.event_types, raw.meta.features,
                          raw.meta.session_gap_seconds)  # fmt: skip
    for row, model in zip(rows, (calibrated, raw), strict=True):
        want = evaluate_model(model, sessions)
        assert [float(v) for v in row.split()[3:]] == pytest.approx(
            [want[k] for k in columns], abs=1e-4
        )
    # the calibration moves ECE and Brier, never the AUC
    cal_row, raw_row = ([float(v) for v in r.split()[3:]] for r in rows)
    assert cal_row[0] == raw_row[0] and cal_row[2] != raw_row[2]
    image = png.read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n" and len(image) > 10_000
    body = received[0]
    names_pushed = set(re.findall(r"^(intentstream_\w+)\{", body, re.M))
    assert {f"intentstream_evaluate_{k}" for k in columns} <= names_pushed
    assert all(re.fullmatch(r"intentstream_evaluate_[a-z_]+", n) for n in names_pushed)
    assert f'intentstream_evaluate_ece_last{{model="{names[0]}"}}' in body

    as_json = run_cli("model", "evaluate", names[0], "--data", str(data), "--json")
    got = json.loads(as_json.stdout)[names[0]]
    assert got["calibrated"] is True and set(columns) <= set(got)
    assert got["ece_last"] == pytest.approx(evaluate_model(calibrated, sessions)["ece_last"])
