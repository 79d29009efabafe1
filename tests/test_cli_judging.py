"""`intentstream train` judges its model on test users beside the baselines, `--folds K` over
outer folds, and `intentstream bench --real` over repeated folds against the goals; a shop too
small, a label that never occurs or an input no event carries is one line, exit 2, nothing
written."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from model.data.rich_shop import rich_shop
from tests.conftest import run_cli

SMALL = ["--hidden", "8", "--epochs", "1", "--quiet"]


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Path:
    events, _ = rich_shop(400, seed=2)
    path = tmp_path_factory.mktemp("shop") / "shop.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


@pytest.fixture(scope="module")
def judged(shop, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One judged train run with declared inputs (its output and folder: m.npz, r/): a
    judged run costs 20-25 s of CPU, most of it the baselines, so two tests read this one."""
    out = tmp_path_factory.mktemp("judged")
    run = run_cli("train", "--data", str(shop), "--numeric", "price:log1p", "--item",
                  "product_id", *SMALL, "--report", str(out / "r"),
                  "--out", str(out / "m.npz"), timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run, out


def test_train_reports_its_test_users_beside_the_baselines(judged) -> None:
    run, out = judged
    assert "test users:" in run.stdout and "held out before every choice" in run.stdout
    table = run.stdout.split("test users:")[1]
    for row in ("intentstream", "logistic regression", "gradient boosting", "AUC @3"):
        assert row in table
    report = json.loads((out / "r" / "report.json").read_text())
    test = report["test"]
    assert set(test["metrics"]) == {"intentstream", "logistic regression", "gradient boosting"}
    assert test["users"] == report["data"]["test_users"] > 0
    assert 0 < test["positive_sessions"] < test["sessions"]
    assert sum(b["steps"] for b in test["reliability"]) >= test["sessions"]


def test_train_without_test_users_says_so(shop) -> None:
    run = run_cli("train", "--data", str(shop), "--test-fraction", "0", *SMALL, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "none held out (--test-fraction 0)" in run.stdout


def test_train_folds_judges_each_fold_then_trains(shop) -> None:
    run = run_cli("train", "--data", str(shop), "--folds", "2", *SMALL, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("held-out sessions") == 2
    assert "| intentstream minus the better baseline, per fold |" in run.stdout
    assert "test users:" in run.stdout  # then the model itself, as without --folds


def test_bench_real_judges_against_the_goals(shop) -> None:
    run = run_cli("bench", "--real", "--data", str(shop), "--folds", "2", "--repeats", "1",
                  *SMALL, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("machine: ")
    assert "| score decile | mean score | observed rate | steps |" in run.stdout
    goals = [line for line in run.stdout.splitlines() if line.startswith("goal ")]
    assert len(goals) == 3 and all((" met " in g) != (" missed " in g) for g in goals)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--folds", "300"], "too few for 300 folds"),
        (["--folds", "1"], "--folds 1: at least 2"),
        (["--label-type", "checkout"], "a classifier needs both classes"),
        (["--numeric", "prize"], "no event carries input(s) prize"),
    ],
)
def test_bad_requests_are_one_line_exit_2_and_nothing_written(shop, tmp_path, flags, says):
    out = tmp_path / "m.npz"
    run = run_cli("train", "--data", str(shop), *flags, *SMALL, "--out", str(out), timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_bench_real_refuses_a_shop_too_small_for_its_folds(shop) -> None:
    run = run_cli("bench", "--real", "--data", str(shop), "--folds", "400", *SMALL)
    assert run.returncode == 2 and "too few for 400 folds" in run.stderr


def test_model_evaluate_judges_a_model_on_the_users_its_training_held_out(shop, judged, tmp_path):
    """The judged run's model (with declared inputs), evaluated again on its held-out users,
    gives the report's figures."""
    trained = judged[1] / "m.npz"
    by_hand = tmp_path / "init.npz"
    made = run_cli("model", "init", "--event-types", "view,add_to_cart", "--hidden", "4",
                   "--out", str(by_hand))  # fmt: skip
    assert made.returncode == 0, made.stderr
    ev = run_cli("model", "evaluate", str(trained), str(by_hand), "--data", str(shop),
                 "--held-out", "--json", timeout=600)  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    results = json.loads(ev.stdout)
    ours = results[str(trained)]["held_out"]
    report = json.loads((judged[1] / "r" / "report.json").read_text())["test"]
    assert ours["sessions"] == report["sessions"] and ours["users"] == report["users"]
    for scorer in ("intentstream", "logistic regression", "gradient boosting"):
        assert ours["metrics"][scorer]["auc_last"] == pytest.approx(
            report["metrics"][scorer]["auc_last"], abs=1e-6
        )
    assert results[str(by_hand)]["held_out"] is None
    table = run_cli("model", "evaluate", str(by_hand), "--data", str(shop), "--held-out")
    assert table.returncode == 0 and "no held-out users in these events" in table.stdout


def test_train_search_says_what_it_tried_and_kept(shop, tmp_path) -> None:
    run = run_cli("train", "--data", str(shop), "--search", "0.001", *SMALL, "--report",
                  str(tmp_path / "r"), timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "search: as given: validation loss" in run.stdout
    assert "search: kept the configuration as given" in run.stdout
    search = json.loads((tmp_path / "r" / "report.json").read_text())["search"]
    assert search["tried"][0]["changes"] == {} and search["untried"] > 0
