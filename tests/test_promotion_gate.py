"""`intentstream train --promote`'s gate keeps thresholds honest (docs/models.md, The
promotion gate): a candidate clearly worse calibrated than the current model on the same
validation users is not promoted unless --force, and each live rule's share of validation
sessions fired is printed under both models."""

from __future__ import annotations

import re

from model.artifact import ModelMeta, load_model, validate_model
from model.data.synthetic import synthetic_events
from tests.conftest import NO_TEST_USERS, run_cli
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import delete_rule, set_rule

SHARE = re.compile(
    r"^rule (\S+) \(above [0-9.]+\): fires on ([0-9.]+)% under current version (\d+), "
    r"([0-9.]+)% under the candidate, of (\d+) validation sessions$",
    re.M,
)


def test_the_gate_refuses_a_clearly_worse_calibrated_candidate_and_shows_rule_shares(
    redis_server, tmp_path
):
    r = connect(redis_server.url)
    registry, keys = Registry(r), Keys()
    publish(r, list(synthetic_events(12_000, 600, seed=8)))
    train = ["train", "--from-redis", "--redis-url", redis_server.url, "--hidden", "16",
             "--epochs", "3", "--quiet", "--calibration-min-sessions", "50",
             *NO_TEST_USERS]  # fmt: skip

    # the current model: the candidate's very weights with a bad map (every score pushed up)
    made = run_cli(*train, "--out", str(tmp_path / "m.npz"))
    assert made.returncode == 0, made.stderr
    model = load_model(tmp_path / "m.npz")
    bad = {"method": "isotonic", "x": [0.05, 0.95], "y": [0.6, 0.99]}
    meta = model.meta.model_dump() | {"calibration": bad}
    registry.publish_model(validate_model(ModelMeta.model_validate(meta), model.arrays), True)
    set_rule(r, keys, make_rule(name="hot", above=0.5))
    set_rule(r, keys, make_rule(name="carts", above=0.3, types=["add_to_cart"], min_events=2))

    better = run_cli(*train, "--promote")
    assert better.returncode == 0, better.stdout + better.stderr
    assert "promoted version 2 to current" in better.stdout and registry.current() == "2"
    shares = {m[0]: m[1:] for m in SHARE.findall(better.stdout)}
    assert set(shares) == {"carts", "hot"}, better.stdout
    for now, version, after, sessions in shares.values():
        assert version == "1" and int(sessions) > 100
        assert 0 <= float(now) <= 100 and 0 <= float(after) <= 100
    assert shares["hot"][0] != shares["hot"][2]  # the bad map moves what fires
    ece = re.search(r"validation ECE, current version 1 -> candidate: all steps ([0-9.]+) -> "
                    r"([0-9.]+), last step", better.stdout)  # fmt: skip
    assert ece and float(ece[1]) > float(ece[2]) + 0.02, better.stdout

    # and the other way round: the same weights, raw (no map), against a calibrated current
    delete_rule(r, keys, "hot")
    delete_rule(r, keys, "carts")
    worse = run_cli(*train, "--promote", "--no-calibrate")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    refusal = [line for line in worse.stdout.splitlines() if line.startswith("not promoted")]
    assert len(refusal) == 1, worse.stdout  # the AUC is the same: only the calibration refuses
    got = re.fullmatch(
        r"not promoted: validation calibration error \(ECE, all steps\) ([0-9.]+) is more than "
        r"0\.02 above current version 2's ([0-9.]+) on the same users \(--force promotes anyway\)",
        refusal[0],
    )
    assert got and float(got[1]) > float(got[2]) + 0.02, refusal
    assert "published version 3" in worse.stdout and registry.current() == "2"
    assert "rule " not in worse.stdout  # no rules: no share lines

    forced = run_cli(*train, "--promote", "--no-calibrate", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert registry.current() == "4" and "not promoted" not in forced.stdout
