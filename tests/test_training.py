"""Training: BPTT gradients, truncation, clipping, sessions, determinism, and the CLI."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from model.artifact import load_model
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.params import pack, unpack
from model.random_init import random_model
from model.training.bptt import clip_global_norm, loss_and_gradients, predict
from model.training.sessions import DataError, Session, pad, sessionize
from model.training.train import (
    TrainConfig,
    TrainingDivergedError,
    moved_towards,
    prepare_training,
    train,
)
from tests.conftest import NO_TEST_USERS, run_cli
from tests.offline import offline_scores
from tests.workers import WorkerProcess, wait_for
from worker.common.connection import connect
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish


def float64_params(
    layers: int, n_features: int, n_types: int = 3, hidden: int = 4, seed: int = 1, cell="rnn",
    wide: bool = False,
):  # fmt: skip
    model = random_model(
        [f"t{i}" for i in range(n_types)], hidden=hidden, layers=layers,
        features=["gap"] if n_features else [], embedding_dim=3, seed=seed, dtype=np.float64,
        cell=cell, wide_head=wide,
    )  # fmt: skip
    return {k: v.astype(np.float64).copy() for k, v in model.arrays.items()}


def random_batch(n_types: int, n_features: int, lengths=(4, 7, 2), seed: int = 0):
    rng = np.random.default_rng(seed)
    sessions = [
        Session(
            "u", rng.integers(0, n_types + 1, n), rng.uniform(0, 3, (n, n_features)), float(i % 2)
        )
        for i, n in enumerate(lengths)
    ]
    return pad(sessions, n_features)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize(
    ("layers", "n_features", "wide"),
    [(1, 0, False), (1, 1, False), (2, 0, False), (2, 1, False), (2, 1, True)],
)
def test_bptt_gradients_equal_central_differences(layers, n_features, cell, wide):
    params = float64_params(layers, n_features, cell=cell, wide=wide)
    batch = random_batch(3, n_features)
    _, grads = loss_and_gradients(params, batch, bptt=50)  # no truncation: the exact gradient
    # the 2-layer LSTM's layer-0 forget-gate gradients are ~3e-5: at eps 1e-6 their central
    # differences lose digits to rounding (the error falls tenfold at 1e-5)
    eps = 1e-5 if cell == "lstm" else 1e-6
    for name, p in params.items():
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            old = p[idx]
            p[idx] = old + eps
            up, _ = loss_and_gradients(params, batch, bptt=50)
            p[idx] = old - eps
            down, _ = loss_and_gradients(params, batch, bptt=50)
            p[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        scale = max(np.abs(numeric).max(), np.abs(grads[name]).max(), 1e-12)
        assert np.abs(numeric - grads[name]).max() / scale < 1e-6, name


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_truncation_stops_gradients_bptt_steps_back(cell):
    # ten steps, each a type of its own: a type's embedding gradient is its step's input gradient
    params = float64_params(layers=2, n_features=0, n_types=10, hidden=5, cell=cell)
    types = np.arange(10)[None, :]
    mask = np.zeros((1, 10))
    mask[0, 8] = 1.0  # the loss at step 8 only
    from model.training.sessions import SessionBatch

    batch = SessionBatch(types, np.zeros((1, 10, 0)), mask, np.ones(1))
    _, grads = loss_and_gradients(params, batch, bptt=3)  # windows [0,3) [3,6) [6,9) [9,10)
    row_norm = np.abs(grads["embedding"]).sum(axis=1)
    assert np.all(row_norm[6:9] > 0)  # within bptt steps: reached
    assert np.all(row_norm[:6] == 0)  # more than bptt steps back: cut
    assert row_norm[9] == 0  # the future never feeds the past
    _, full = loss_and_gradients(params, batch, bptt=100)
    assert np.all(np.abs(full["embedding"]).sum(axis=1)[:9] > 0)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_hidden_state_is_carried_across_windows_and_reset_between_sessions(cell):
    params = float64_params(layers=2, n_features=1, cell=cell)
    long = random_batch(3, 1, lengths=(23,), seed=3)
    # the loss does not depend on the window length: the state is carried, only gradients stop
    losses = [loss_and_gradients(params, long, bptt=k)[0] for k in (1, 2, 5, 23, 100)]
    np.testing.assert_allclose(losses, losses[0], rtol=1e-12)
    # sessions in one batch never share state: a batch scores each as if alone
    both = random_batch(3, 1, lengths=(9, 5), seed=4)
    P = predict(params, both)
    for i in range(2):
        one = pad([Session("u", both.types[i][both.mask[i] > 0], both.features[i][both.mask[i] > 0],
                           both.labels[i])], 1)  # fmt: skip
        np.testing.assert_allclose(predict(params, one)[0], P[i, : one.types.shape[1]], rtol=1e-12)


def test_sessions_split_at_the_gap_and_stop_before_the_purchase():
    events = [
        {"user_id": "a", "type": "view", "ts": 0},
        {"user_id": "a", "type": "add_to_cart", "ts": 10_000},
        {"user_id": "a", "type": "purchase", "ts": 20_000},
        {"user_id": "a", "type": "coupon", "ts": 30_000},  # after the purchase: never an input
        {"user_id": "a", "type": "view", "ts": 10_000_000},  # 2.7 h later: a new session
        {"user_id": "a", "type": "search", "ts": 10_005_000},
    ]
    types = ["view", "add_to_cart", "coupon", "search", "purchase"]
    sessions = sessionize(events, types, ["gap"], 1800, "purchase")
    assert [list(s.types) for s in sessions] == [[0, 1], [0, 3]]
    assert [s.label for s in sessions] == [1.0, 0.0]
    np.testing.assert_allclose(sessions[0].features[:, 0], [0.0, np.log1p(10.0)], rtol=1e-6)
    assert 2 not in sessions[0].types and 4 not in sessions[0].types


def test_clipping_to_the_global_norm():
    grads = {"a": np.array([3.0, 4.0]), "b": np.array([[12.0]])}  # norm 13
    assert clip_global_norm(grads, 6.5) == pytest.approx(13.0)
    total = np.sqrt(sum((g**2).sum() for g in grads.values()))
    assert total == pytest.approx(6.5)
    np.testing.assert_allclose(grads["a"], [1.5, 2.0])
    small = {"a": np.array([0.3, 0.4])}
    clip_global_norm(small, 1.0)
    np.testing.assert_array_equal(small["a"], [0.3, 0.4])  # below theta: untouched


def synthetic(n_events: int, n_users: int, seed: int) -> list[dict]:
    return list(synthetic_events(n_events, n_users, seed=seed))


def test_same_seed_same_data_gives_bit_identical_weights():
    events = synthetic(4000, 200, seed=1)
    config = TrainConfig(hidden=8, epochs=2, seed=3)
    a, b = train(events, config).model, train(events, config).model
    for name in a.arrays:
        assert a.arrays[name].tobytes() == b.arrays[name].tobytes(), name
    other = train(events, config.model_copy(update={"seed": 4})).model
    assert other.arrays["layer0.W_hh"].tobytes() != a.arrays["layer0.W_hh"].tobytes()


def test_moved_towards_steps_an_exponential_moving_average():
    average = random_model(["a", "b"], hidden=4, seed=0)
    params = pack(average.arrays, "rnn", np.float32, None)
    start = params.copy()
    target = params._with(np.full_like(a, 2.0) for a in params.arrays().values())
    for _ in range(5):
        moved_towards(params, target, 0.1)
    for name, a in params.arrays().items():
        want = 2.0 + (start.arrays()[name] - 2.0) * 0.9**5
        np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_weight_average_keeps_the_moving_average_of_every_steps_weights(monkeypatch):
    """One epoch with --weight-average w: the artifact holds a(n) = a(n-1) + (1 - w) (p(n) -
    a(n-1)) over the steps' weights p(n) from the initial ones, worked out here apart; the
    same run twice is bit-identical, and it differs from the last step's weights."""
    import model.training.train as training

    events = synthetic(4000, 200, seed=1)
    config = TrainConfig(hidden=8, epochs=1, seed=3, weight_average=0.9, calibrate=False)
    steps, first = [], []
    moved = training.moved_towards

    def recorded(average, params, rate):
        if not first:
            first.append(average.copy())  # the initial weights: no step moved it yet
        steps.append(params.copy())
        moved(average, params, rate)

    monkeypatch.setattr(training, "moved_towards", recorded)
    kept = train(events, config).model
    assert len(steps) >= 3
    expected = {k: a.astype(np.float64) for k, a in first[0].arrays().items()}
    for p in steps:
        for k, a in p.arrays().items():
            expected[k] += 0.1 * (a - expected[k])
    want = unpack(first[0]._with(expected[k].astype(np.float32) for k in expected), None)
    for name, a in want.items():
        np.testing.assert_allclose(kept.arrays[name], a, rtol=1e-4, atol=1e-5, err_msg=name)
    last = unpack(steps[-1], None)
    assert not np.allclose(kept.arrays["layer0.W_hh"], last["layer0.W_hh"])
    monkeypatch.setattr(training, "moved_towards", moved)
    again = train(events, config).model
    for name in kept.arrays:
        assert kept.arrays[name].tobytes() == again.arrays[name].tobytes(), name


def test_prepared_data_train_as_the_events_do_and_serve_only_their_data_config():
    """prepare_training's result (what long_range shares between cells) gives the same model
    and report as the events, for another cell too; a config that reads the data otherwise
    (another seed splits other users) is refused."""
    events = synthetic(4000, 200, seed=1)
    config = TrainConfig(hidden=8, epochs=1, seed=3, test_fraction=0.1)
    data = prepare_training(events, config)
    for cell in ("rnn", "gru"):
        asked = config.model_copy(update={"cell": cell})
        a, b = train(events, asked), train(data, asked)
        for name in a.model.arrays:
            assert a.model.arrays[name].tobytes() == b.model.arrays[name].tobytes(), name
        assert a.report["metrics"] == b.report["metrics"]
        assert a.report["baseline"] == b.report["baseline"]
        assert a.report["data"] == b.report["data"] and a.test_events == b.test_events
    with pytest.raises(ValueError, match="another data config"):
        train(data, config.model_copy(update={"seed": 4}))


def test_training_learns_order_and_beats_the_bag_of_types_baseline():
    result = train(synthetic(40_000, 2000, seed=3), TrainConfig(hidden=32, epochs=12, seed=0))
    m, base = result.report["metrics"], result.report["baseline"]
    assert m["auc_last"] > 0.8
    assert m["auc_last"] > base["auc_last"] + 0.01
    assert m["logloss_last"] < base["logloss_last"]
    assert result.model.meta.model_extra["metrics"]["auc_last"] == m["auc_last"]
    epochs = result.report["epochs"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([], "no events to train on"),
        (
            [{"user_id": f"u{i}", "type": "view", "ts": i} for i in range(50)],
            r"all \d+ sessions are negative",
        ),
        ([{"user_id": "u", "type": "purchase", "ts": 0}], "no sessions with inputs"),
    ],
)
def test_unusable_data_is_a_clear_error(events, message):
    with pytest.raises(DataError, match=message):
        train(events, TrainConfig(hidden=4, epochs=1))


class Sabotage:
    """Wraps the training loop's mini-batches and optimiser: from epoch `at` on, every update
    is followed by `spoil(params)`, the collapse of issue 14 (or a NaN) made to order."""

    def __init__(self, monkeypatch, at: int, spoil) -> None:
        import model.training.train as training

        self.epoch, self.at, self.spoil = 0, at, spoil
        batches, make = training.minibatches, training.make_optimizer

        def counting_batches(*args, **kwargs):
            self.epoch += 1
            return batches(*args, **kwargs)

        def spoiling_optimizer(*args, **kwargs):
            optimizer = make(*args, **kwargs)
            step = optimizer.step

            def spoiled_step(params, grads):
                step(params, grads)
                if self.epoch >= self.at:
                    self.spoil(params)

            optimizer.step = spoiled_step
            return optimizer

        monkeypatch.setattr(training, "minibatches", counting_batches)
        monkeypatch.setattr(training, "make_optimizer", spoiling_optimizer)


def blow_up(params: dict[str, np.ndarray]) -> None:
    params["w_q"][:] = 30.0 * np.sign(params["w_q"])  # saturated, confident scores: loss jumps


def make_nan(params: dict[str, np.ndarray]) -> None:
    params["W_h0"][0, 0] = np.nan


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_a_run_forced_to_collapse_keeps_the_earlier_epoch(monkeypatch, cell):
    events = synthetic(4000, 200, seed=1)
    config = TrainConfig(hidden=8, epochs=6, patience=2, seed=3, cell=cell)
    first = train(events, config.model_copy(update={"epochs": 1})).model  # epoch 1 alone
    Sabotage(monkeypatch, at=2, spoil=blow_up)
    result = train(events, config)
    epochs = result.report["epochs"]
    assert len(epochs) == 3  # epoch 1, then two without improvement: stopped early
    assert epochs[1]["validation_loss"] > epochs[0]["validation_loss"] + 0.1  # it did collapse
    kept = result.report["kept_epoch"]
    assert kept["epoch"] == 1 and kept["stopped"] == "patience"
    assert kept["validation_loss"] == epochs[0]["validation_loss"]
    assert "kept epoch 1 of 3" in kept["reason"]
    assert "stopped after 2 epoch(s) without a lower validation loss" in kept["reason"]
    for name, a in first.arrays.items():  # the artifact holds epoch 1's weights, bit for bit
        assert result.model.arrays[name].tobytes() == a.tobytes(), name


def test_a_run_that_ran_every_epoch_is_not_said_to_have_stopped_early(monkeypatch):
    # patience runs out at the last epoch: every epoch ran, nothing stopped early
    events = synthetic(4000, 200, seed=1)
    Sabotage(monkeypatch, at=2, spoil=blow_up)
    result = train(events, TrainConfig(hidden=8, epochs=3, patience=2, seed=3))
    reason = result.report["kept_epoch"]["reason"]
    assert len(result.report["epochs"]) == 3 and "kept epoch 1 of 3" in reason
    assert "early" not in reason, reason
    assert result.model.meta.model_extra["kept_epoch"]["epoch"] == 1


def test_fine_tuning_an_lstm_keeps_its_cell_and_continues_its_state_space():
    events = synthetic(4000, 200, seed=1)
    parent = train(events, TrainConfig(hidden=8, epochs=1, seed=3, cell="lstm")).model
    tuned = train(events, TrainConfig(epochs=1, seed=3), init=parent, state_space="1").model
    assert (tuned.meta.cell, tuned.meta.hidden) == ("lstm", 8)  # the parent's, not the config's
    assert tuned.meta.model_extra["state_space"] == "1"
    assert set(tuned.arrays) == set(parent.arrays)
    assert any(not np.array_equal(tuned.arrays[k], parent.arrays[k]) for k in parent.arrays)


def test_a_loss_that_turns_nan_never_reaches_the_artifact(monkeypatch):
    events = synthetic(4000, 200, seed=1)
    config = TrainConfig(hidden=8, epochs=6, seed=3)
    Sabotage(monkeypatch, at=3, spoil=make_nan)
    result = train(events, config)
    kept = result.report["kept_epoch"]
    assert len(result.report["epochs"]) == 3 and kept["stopped"] == "diverged"
    assert kept["epoch"] == 2 and "diverged" in kept["reason"]
    assert all(np.isfinite(a).all() for a in result.model.arrays.values())


def test_a_run_diverged_from_the_first_epoch_writes_nothing(monkeypatch):
    Sabotage(monkeypatch, at=1, spoil=make_nan)
    with pytest.raises(TrainingDivergedError, match="diverged in epoch 1"):
        train(synthetic(4000, 200, seed=1), TrainConfig(hidden=8, epochs=3, seed=3))


def write_jsonl(path: Path, events: list[dict], extra_lines: dict[int, str] | None = None) -> None:
    lines = [json.dumps(e) for e in events]
    for at, line in sorted((extra_lines or {}).items()):  # positions in the final file
        lines.insert(at, line)
    path.write_text("\n".join(lines) + "\n")


def test_train_cli_reports_bad_lines_and_writes_artifact_and_report(tmp_path):
    data = tmp_path / "events.jsonl"
    write_jsonl(
        data, synthetic(6000, 300, seed=2), {3: "{oops", 10: '{"user_id": "", "type": "x"}'}
    )
    args = ["train", "--data", str(data), "--hidden", "8", "--epochs", "2", "--quiet",
            "--cell", "gru", "--patience", "1",
            "--event-types", "view,search,add_to_cart,coupon,checkout,purchase",
            "--out", str(tmp_path / "m.npz"), "--report", str(tmp_path / "report"),
            *NO_TEST_USERS]  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert f"{data}:4: not valid JSON" in result.stderr
    assert f"{data}:11: user_id" in result.stderr
    assert "skipped 2 bad line(s)" in result.stderr
    assert "bag-of-types baseline" in result.stdout
    assert "kept epoch" in result.stdout
    model = load_model(tmp_path / "m.npz")
    assert model.meta.event_types[-1] == "purchase"
    assert model.meta.cell == "gru" and "layer0.W_hn" in model.arrays
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["data"]["unknown_type_events"] > 0  # remove_from_cart is not in the list
    assert 1 <= len(report["epochs"]) <= 2 and "auc_last" in report["baseline"]
    assert report["config"]["cell"] == "gru" and report["config"]["patience"] == 1
    png = (tmp_path / "report" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_train_cli_trains_an_lstm_whose_scores_the_score_command_reproduces(tmp_path):
    data = tmp_path / "events.jsonl"
    events = synthetic(6000, 300, seed=2)
    write_jsonl(data, events)
    out = tmp_path / "lstm.npz"
    result = run_cli("train", "--data", str(data), "--hidden", "8", "--epochs", "2", "--quiet",
                     "--cell", "lstm", "--out", str(out), *NO_TEST_USERS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert model.meta.cell == "lstm" and model.arrays["layer0.W_hf"].shape == (8, 8)
    assert model.meta.model_extra["train_config"]["cell"] == "lstm"
    assert model.meta.model_extra["metrics"]["auc_last"] > 0.6
    scored = offline_scores(out, events[:50])
    assert len(scored) == 50 and all(0 < s < 1 for s in scored)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "no events to train on"),
        ([{"user_id": "a", "type": "view", "ts": 1}] * 3, "sessions are negative"),
    ],
)
def test_train_cli_refuses_unusable_data_without_a_traceback(tmp_path, lines, message):
    data = tmp_path / "e.jsonl"
    write_jsonl(data, lines)
    result = run_cli("train", "--data", str(data), "--quiet")
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


class Pushgateway(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, str]]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        Pushgateway.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_train_from_redis_publishes_promotes_and_a_running_worker_switches(redis_server, tmp_path):
    r = connect(redis_server.url)
    registry = Registry(r)
    registry.publish_model(random_model([*EVENT_TYPES, LABEL_TYPE], hidden=8, seed=1), promote=True)
    publish(r, synthetic(20_000, 1000, seed=5))
    worker = WorkerProcess(redis_server.url, tmp_path / "x", tmp_path / "w.log",
                           "--model-poll-seconds", "0.5", "--retention-seconds", "0")  # fmt: skip
    worker.args[worker.args.index("--model") : worker.args.index("--model") + 2] = []
    gateway = ThreadingHTTPServer(("127.0.0.1", 0), Pushgateway)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    worker.start()
    try:
        result = run_cli(
            "train", "--from-redis", "--redis-url", redis_server.url, "--hidden", "16",
            "--epochs", "6", "--promote", "--quiet", "--report", str(tmp_path / "rep"),
            "--pushgateway", f"127.0.0.1:{gateway.server_port}", *NO_TEST_USERS,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "published version 2" in result.stdout and "promoted version 2" in result.stdout
        assert registry.current() == "2"
        # the running worker picks the new version up
        publish(r, [{"user_id": "new-user", "type": "view"}])

        def scored_by_2() -> bool:
            last = r.xrevrange("intentstream:scores:{0}", count=1)
            return bool(last) and last[0][1][b"model"] == b"2"

        def scored_by_2_yet() -> bool:
            if scored_by_2():
                return True
            publish(r, [{"user_id": "new-user", "type": "view"}])
            return False

        wait_for(scored_by_2_yet, timeout=120, what="scores by version 2")

        # a worse model is published but not promoted, unless forced
        worse = run_cli(
            "train", "--from-redis", "--redis-url", redis_server.url, "--hidden", "2",
            "--epochs", "1", "--lr", "0.00001", "--promote", "--quiet", *NO_TEST_USERS,
        )  # fmt: skip
        assert worse.returncode == 1, worse.stdout + worse.stderr
        assert "published version 3" in worse.stdout and "not promoted" in worse.stdout
        assert registry.current() == "2"
        forced = run_cli(
            "train", "--from-redis", "--redis-url", redis_server.url, "--hidden", "2",
            "--epochs", "1", "--lr", "0.00001", "--promote", "--force", "--quiet", *NO_TEST_USERS,
        )  # fmt: skip
        assert forced.returncode == 0 and registry.current() == "4"
    finally:
        worker.terminate()
        gateway.shutdown()
    path, body = Pushgateway.received[0]
    assert path == "/metrics/job/intentstream_train"
    assert "intentstream_train_validation_auc" in body and "intentstream_train_events" in body
