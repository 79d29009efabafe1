"""`intentstream train` as a user meets it: the vocabulary keeps junk out, the report says
what was left out, and the report's plot reads right."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model.artifact import load_model
from model.data.synthetic import synthetic_events
from model.training.config import TrainConfig
from model.training.prepare import vocabulary
from model.training.report import write_report
from model.training.train import TrainResult
from tests.conftest import NO_TEST_USERS, run_cli


def test_vocabulary_leaves_out_types_rarer_than_min_type_count():
    events = [{"type": "view"}] * 12 + [{"type": "cart"}] * 10 + [{"type": "weird"}] * 9
    assert vocabulary(events, TrainConfig()) == ["view", "cart"]
    assert vocabulary(events, TrainConfig(min_type_count=1)) == ["view", "cart", "weird"]
    # an explicit vocabulary is taken as given
    assert vocabulary(events, TrainConfig(event_types=["weird"])) == ["weird"]


@pytest.mark.integration
def test_one_stray_event_type_goes_to_the_unknown_row_and_the_report_lists_it(tmp_path):
    events = list(synthetic_events(6000, 300, seed=4))
    events.insert(100, {"user_id": "user-3", "type": "weird_type", "ts": events[100]["ts"]})
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    out, report_dir = tmp_path / "m.npz", tmp_path / "report"
    result = run_cli("train", "--data", str(data), "--hidden", "8", "--epochs", "1", "--quiet",
                     "--out", str(out), "--report", str(report_dir), *NO_TEST_USERS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_model(out)
    assert "weird_type" not in model.meta.event_types
    assert {"view", "add_to_cart", "purchase"} <= set(model.meta.event_types)
    report = json.loads((report_dir / "report.json").read_text())
    assert report["data"]["left_out_types"] == {"weird_type": 1}
    assert report["data"]["unknown_type_events"] == 1
    assert report["config"]["min_type_count"] == 10
    assert "left out of the vocabulary" in result.stdout and "weird_type (1)" in result.stdout

    # with --min-type-count 1 it is kept, and nothing is reported left out
    again = run_cli("train", "--data", str(data), "--hidden", "8", "--epochs", "1", "--quiet",
                    "--min-type-count", "1", "--out", str(out), *NO_TEST_USERS)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "weird_type" in load_model(out).meta.event_types
    assert "left out" not in again.stdout


def test_the_reports_epoch_axis_has_whole_numbers(tmp_path: Path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    seen = []
    original = Figure.savefig

    def capture(self, *args, **kwargs):
        seen.append([t for t in self.axes[0].get_xticks()])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    epochs = [{"epoch": e, "train_loss": 1 / e, "validation_loss": 1.1 / e} for e in (1, 2, 3)]
    report = {"epochs": epochs, "metrics": {"auc_last": 0.9}, "baseline": {"auc_last": 0.8},
              "kept_epoch": {"epoch": 3}}  # fmt: skip
    curve = (np.array([0.0, 0.5, 1.0]), np.array([0.0, 0.8, 1.0]))
    result = TrainResult(model=None, report=report, curves={"rnn": curve, "baseline": curve})
    write_report(result, tmp_path)
    ticks = seen[0]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


@pytest.mark.integration
def test_off_a_terminal_progress_is_one_line_per_epoch_and_a_bad_report_is_refused_first(
    tmp_path,
):
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in synthetic_events(3000, 200, seed=5)))
    result = run_cli("train", "--data", str(data), "--hidden", "8", "--epochs", "3",
                     "--out", str(tmp_path / "m.npz"), *NO_TEST_USERS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    epochs = [line for line in result.stderr.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 3 and all("loss" in line for line in epochs), result.stderr
    assert "\r" not in result.stderr and "it/s" not in result.stderr  # no redrawn tqdm bar
    # --report naming a file: refused before any training, not after it
    taken = tmp_path / "taken"
    taken.write_text("x")
    refused = run_cli("train", "--data", str(data), "--epochs", "3", "--report", str(taken))
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"error: --report {taken}: exists and is not a directory"


def test_the_report_draws_a_reliability_panel_with_the_raw_scores_faintly(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from model.training.train import train

    seen = []
    original = Figure.savefig

    def capture(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    config = TrainConfig(hidden=16, epochs=3, calibration_min_sessions=50)  # a small data set
    result = train(synthetic_events(12000, 600, seed=4), config)
    write_report(result, tmp_path)
    panel = seen[0].axes[2]
    assert panel.get_title().startswith("Reliability")
    lines = {ln.get_label(): ln for ln in panel.get_lines() if not ln.get_label().startswith("_")}
    m = result.report["metrics"]
    want_last = f"calibrated, last step (ECE {m['ece_last']:.3f})"
    assert want_last in lines and f"calibrated, all steps (ECE {m['ece_all']:.3f})" in lines
    raw = result.report["metrics_raw"]
    faint = lines[f"raw, last step (ECE {raw['ece_last']:.3f})"]
    assert faint.get_alpha() < lines[want_last].get_alpha()
    # the drawn points are the binned scores whose ECE the report holds
    x, y = lines[want_last].get_data()
    assert len(x) and np.all((x >= 0) & (x <= 1)) and np.all((y >= 0) & (y <= 1))


@pytest.mark.integration
def test_train_prints_and_reports_calibration_beside_the_auc(tmp_path):
    data = tmp_path / "events.jsonl"
    # enough validation sessions for a map that helps users it was not fitted on
    data.write_text("".join(json.dumps(e) + "\n" for e in synthetic_events(12000, 600, seed=4)))
    report_dir = tmp_path / "report"
    result = run_cli("train", "--data", str(data), "--hidden", "16", "--epochs", "3", "--quiet",
                     "--calibration-min-sessions", "50", *NO_TEST_USERS,
                     "--report", str(report_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((report_dir / "report.json").read_text())
    keys = {"auc_last", "auc_all", "logloss_last", "logloss_all", "ece_last", "ece_all",
            "brier_last", "brier_all"}  # fmt: skip
    assert keys <= set(report["metrics"]) and keys <= set(report["metrics_raw"])
    cal = report["calibration"]
    assert cal["method"] == "isotonic" and len(cal["x"]) == len(cal["y"]) >= 1
    lines = result.stdout.splitlines()
    head = next(line for line in lines if line.startswith("validation users"))
    assert head.split("validation users")[1].split() == [
        "AUC", "last", "AUC", "all", "logloss", "last", "logloss", "all",
        "ECE", "last", "ECE", "all", "Brier", "last", "Brier", "all",
    ]  # fmt: skip
    m = report["metrics"]
    rnn = next(line for line in lines if line.startswith("rnn "))
    assert [float(v) for v in rnn.split()[1:]] == pytest.approx(
        [m[k] for k in ("auc_last", "auc_all", "logloss_last", "logloss_all", "ece_last",
                        "ece_all", "brier_last", "brier_all")], abs=1e-4)  # fmt: skip
    raw = next(line for line in lines if line.startswith("rnn, raw head"))
    assert float(raw.split()[7]) == pytest.approx(report["metrics_raw"]["ece_last"], abs=1e-4)
    assert "calibration: isotonic" in result.stdout
    png = (report_dir / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(png[16:20], "big")
    assert width > 1600  # three panels: loss, ROC, reliability
