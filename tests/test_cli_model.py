"""The installed `intentstream` script: model init/show and offline scoring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model.artifact import load_model
from model.scoring import InMemoryScorer, ScoringModel
from tests.conftest import run_cli
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES


def jsonl(events: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_score_reproduces_the_golden_example(golden_path: Path, tmp_path: Path):
    events = tmp_path / "events.jsonl"
    events.write_text(jsonl([{"user_id": "alice", "type": t} for t in GOLDEN_EVENTS]))
    result = run_cli("score", "--model", str(golden_path), str(events))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["type"] for r in rows] == GOLDEN_EVENTS
    assert all(r["user_id"] == "alice" for r in rows)
    np.testing.assert_allclose([r["score"] for r in rows], GOLDEN_SCORES, atol=1e-4)


def test_score_reads_stdin_and_keeps_users_apart(golden_path: Path):
    events = [
        {"user_id": "a", "type": "view"},
        {"user_id": "b", "type": "coupon"},
        {"user_id": "a", "type": "add_to_cart"},
        {"user_id": "b", "type": "view"},
        {"user_id": "a", "type": "coupon"},
        {"user_id": "b", "type": "add_to_cart"},
    ]
    result = run_cli("score", "--model", str(golden_path), stdin=jsonl(events))
    assert result.returncode == 0, result.stderr
    scores = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    np.testing.assert_allclose(scores[0::2], GOLDEN_SCORES, atol=1e-4)
    assert abs(scores[-1] - GOLDEN_SCORES[-1]) > 1e-3  # b's order differs, so does its score


def test_score_reports_bad_lines_and_goes_on(golden_path: Path):
    lines = [
        json.dumps({"user_id": "alice", "type": "view"}),
        "{not json",
        json.dumps({"user_id": "", "type": "view"}),
        json.dumps({"user_id": "alice", "type": "add_to_cart", "ts": "soon"}),
        json.dumps(["a", "list"]),
        json.dumps({"type": "view"}),
        json.dumps({"user_id": "alice", "type": "add_to_cart"}),
        json.dumps({"user_id": "alice", "type": "coupon"}),
    ]
    result = run_cli("score", "--model", str(golden_path), stdin="\n".join(lines) + "\n")
    assert result.returncode == 1
    errors = result.stderr.splitlines()
    assert errors[0].startswith("line 2: not valid JSON")
    assert errors[1].startswith("line 3: user_id:")
    assert errors[2].startswith("line 4: ts:")
    assert errors[3].startswith("line 5: expected a JSON object")
    assert errors[4].startswith("line 6: user_id: Field required")
    assert "5 bad line(s)" in errors[-1]
    scores = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    np.testing.assert_allclose(scores, GOLDEN_SCORES, atol=1e-4)


def test_score_refuses_a_broken_model(tmp_path: Path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    result = run_cli("score", "--model", str(bad), stdin="")
    assert result.returncode == 2
    assert "bad.npz" in result.stderr and "not a valid .npz" in result.stderr
    assert "Traceback" not in result.stderr


def test_model_init_writes_a_seeded_artifact_that_show_describes(tmp_path: Path):
    out = tmp_path / "m.npz"
    args = ["model", "init", "--event-types", "view,add_to_cart,purchase", "--hidden", "32"]
    args += ["--layers", "2", "--features", "gap", "--seed", "5", "--out", str(out)]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert model.meta.layers == 2 and model.meta.hidden == 32
    assert model.meta.event_types == ["view", "add_to_cart", "purchase"]
    assert model.arrays["embedding"].shape == (4, 16)
    assert model.arrays["layer0.W_xh"].shape == (17, 32)

    again = tmp_path / "again.npz"
    run_cli(*args[:-1], str(again))
    assert out.read_bytes() == again.read_bytes()  # same seed, same bytes

    shown = run_cli("model", "show", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "2 layer(s), hidden 32" in shown.stdout
    assert "layer1.W_hh" in shown.stdout and "32x32" in shown.stdout
    assert f"parameters:    {model.parameter_count()}" in shown.stdout
    assert "sha256:" in shown.stdout


def test_model_init_wide_head_writes_a_model_that_show_and_score_read(tmp_path: Path):
    out = tmp_path / "wide.npz"
    result = run_cli("model", "init", "--event-types", "view,add_to_cart", "--hidden", "4",
                     "--features", "gap", "--wide-head", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert model.meta.wide_head and model.arrays["head.W_fq"].shape == (1, 1)
    shown = run_cli("model", "show", str(out))
    assert "wide" in shown.stdout and "head.W_fq" in shown.stdout
    events = tmp_path / "e.jsonl"
    evs = [{"user_id": "u", "type": "view", "ts": 1_700_000_000_000 + k * 60_000} for k in range(3)]
    events.write_text(jsonl(evs))
    scored = run_cli("score", "--model", str(out), str(events))
    assert scored.returncode == 0, scored.stderr
    ours = [json.loads(line)["score"] for line in scored.stdout.splitlines()]
    theirs = InMemoryScorer(ScoringModel(model)).score(
        ["u"] * 3, ["view"] * 3, np.array([e["ts"] for e in evs], np.int64)
    )
    np.testing.assert_allclose(ours, theirs, atol=1e-6)
    # the gap moves the score through the wide part alone when the deep head is silenced
    model.arrays["head.W_hq"][:] = 0.0
    silent = InMemoryScorer(ScoringModel(model)).score(
        ["u"] * 3, ["view"] * 3, np.array([e["ts"] for e in evs], np.int64)
    )
    w, b = float(model.arrays["head.W_fq"][0, 0]), float(model.arrays["head.b_q"][0])
    expected = 1 / (1 + np.exp(-(b + w * np.log1p([0.0, 60.0, 60.0]))))
    np.testing.assert_allclose(silent, expected, atol=1e-6)


def test_model_show_names_the_problem(tmp_path: Path):
    path = tmp_path / "nan.npz"
    result = run_cli("model", "show", str(path))
    assert result.returncode == 2 and "cannot read model file" in result.stderr


def test_cli_score_equals_in_process_scorer(tmp_path: Path):
    model_path = tmp_path / "m.npz"
    run_cli(
        "model",
        "init",
        "--event-types",
        "view,cart,buy",
        "--features",
        "gap",
        "--hidden",
        "16",
        "--out",
        str(model_path),
    )
    rng = np.random.default_rng(0)
    events = [
        {
            "user_id": f"u{rng.integers(20)}",
            "type": str(rng.choice(["view", "cart", "buy", "x"])),
            "ts": 1_700_000_000_000 + 1000 * i,
        }
        for i in range(500)
    ]
    result = run_cli("score", "--model", str(model_path), "--batch-size", "37", stdin=jsonl(events))
    assert result.returncode == 0, result.stderr
    got = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    scorer = InMemoryScorer(ScoringModel(load_model(model_path)))
    want = scorer.score(
        [e["user_id"] for e in events],
        [e["type"] for e in events],
        np.array([e["ts"] for e in events]),
    )
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.integration
def test_model_init_writes_a_gru_that_scores(tmp_path: Path):
    out = tmp_path / "gru.npz"
    args = ["model", "init", "--cell", "gru", "--event-types", "view,add_to_cart",
            "--hidden", "8", "--layers", "2", "--features", "gap", "--out", str(out)]  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert model.meta.cell == "gru" and model.arrays["layer1.W_xz"].shape == (8, 8)
    assert "layer0.W_xh" not in model.arrays and model.arrays["layer0.b_hn"].shape == (8,)
    shown = run_cli("model", "show", str(out))
    assert "cell:          gru, 2 layer(s), hidden 8" in shown.stdout
    assert "layer0.W_hn" in shown.stdout
    scored = run_cli("score", "--model", str(out), stdin=jsonl([{"user_id": "u", "type": "view"}]))
    assert scored.returncode == 0 and 0 < json.loads(scored.stdout)["score"] < 1
    bad = run_cli("model", "init", "--cell", "tcn", "--event-types", "a", "--out", str(out))
    assert bad.returncode == 2 and "invalid choice: 'tcn'" in bad.stderr


@pytest.mark.integration
def test_model_init_writes_an_lstm_that_scores(tmp_path: Path):
    out = tmp_path / "lstm.npz"
    args = ["model", "init", "--cell", "lstm", "--event-types", "view,add_to_cart",
            "--hidden", "8", "--layers", "2", "--features", "gap", "--out", str(out)]  # fmt: skip
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert model.meta.cell == "lstm" and model.arrays["layer1.W_xf"].shape == (8, 8)
    assert model.arrays["layer0.W_xo"].shape == (9, 8) and model.arrays["layer0.b_g"].shape == (8,)
    assert "layer0.W_xh" not in model.arrays and "layer0.b_hn" not in model.arrays
    shown = run_cli("model", "show", str(out))
    assert "cell:          lstm, 2 layer(s), hidden 8" in shown.stdout
    events = [
        {"user_id": "u", "type": "view", "ts": 1_700_000_000_000 + 1000 * i} for i in range(3)
    ]
    scored = run_cli("score", "--model", str(out), stdin=jsonl(events))
    assert scored.returncode == 0, scored.stderr
    rows = [json.loads(line)["score"] for line in scored.stdout.splitlines()]
    assert len(rows) == 3 and all(0 < r < 1 for r in rows)
