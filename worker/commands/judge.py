"""`intentstream bench --real`: a training configuration judged on a real shop's events over
repeated outer folds of users, beside logistic regression and gradient boosting on session
features (model/judging/), against the goals the model is held to (docs/models.md, Judged on
held-out users). Takes `intentstream train`'s flags, so the documented command is judged as
it is typed."""

from __future__ import annotations

import argparse

import numpy as np

from model.benchmarks.kernels import machine_line
from worker.commands.train import read_training_events, train_config, trainer_of
from worker.common.settings import load_settings

REES46_CREDIT = ("REES46 Marketing Platform (rees46.com), Kaggle "
                 "mkechinov/ecommerce-behavior-data-from-multi-category-store")  # fmt: skip
AUC_MARGIN = 0.01  # the model's AUC at the last event over the better baseline's
ECE_BOUND = 0.02  # ECE over all steps, in every fold


def goal_lines(summary: dict, calibrated: tuple[float, float] | None = None) -> list[str]:
    """Each goal, met or missed and by how much; with `calibrated` (calibrated_ece_over),
    what the ECE goal would give a perfectly calibrated scorer on the same folds."""
    from model.judging.baselines import BOOSTED
    from model.judging.protocol import MODEL

    scorers, paired = summary["scorers"], summary["paired"]
    last = paired["auc_last"]
    met = last["mean"] >= AUC_MARGIN and last["ahead"] * 2 > last["of"]
    lines = [
        f"goal AUC last >= better baseline + {AUC_MARGIN} and ahead in most folds: "
        f"{'met' if met else 'missed'} ({last['mean']:+.3f} against {last['against']}, "
        f"ahead in {last['ahead']} of {last['of']} folds)"
    ]
    ours, theirs = scorers[MODEL]["auc_all"]["mean"], scorers[BOOSTED]["auc_all"]["mean"]
    lines.append(f"goal AUC all >= gradient boosting trained on every prefix: "
                 f"{'met' if ours >= theirs else 'missed'} ({ours:.3f} against {theirs:.3f}, "
                 f"{ours - theirs:+.3f})")  # fmt: skip
    ece = np.array(scorers[MODEL]["ece_all"]["folds"])
    over = int(np.sum(ece > ECE_BOUND))
    lines.append(f"goal ECE all <= {ECE_BOUND} in every fold: {'met' if not over else 'missed'} "
                 f"(worst {ece.max():.3f}; {over} of {len(ece)} folds above)")  # fmt: skip
    if calibrated is not None:
        folds_over, none_over = calibrated
        lines.append(f"  a perfectly calibrated scorer on these folds' sessions (labels drawn "
                     f"from the model's scores): {folds_over:.1f} of {len(ece)} folds above "
                     f"{ECE_BOUND} on average, none above in {none_over:.0%} of draws")  # fmt: skip
    return lines


def run_real_bench(args: argparse.Namespace) -> int:
    """The benchmark; returns its exit code (DataError and bad flags raise: one line, exit 2)."""
    from model.judging.protocol import calibrated_ece_over, judge, outer_folds, summary
    from model.judging.report import folds_table, reliability_table
    from model.training.sessions import DataError

    settings = load_settings(args, model=None)
    config = train_config(args)
    events = read_training_events(args, settings)
    users = sorted({e["user_id"] for e in events})
    k = args.folds or 5
    if k < 2 or args.repeats < 1:
        raise DataError(f"--folds {k} --repeats {args.repeats}: at least 2 folds and 1 repeat")
    if len(users) < 2 * k:
        raise DataError(f"--folds {k}: {len(users)} users are too few for {k} folds")
    print(f"machine: {machine_line()}")
    source = " ".join(args.data) if args.data else "the retained streams"
    print(f"data: {source}, {len(events)} events, {len(users)} users")
    if args.format == "opencdp":
        print(f"Open CDP events; for the REES46 dataset, credit: {REES46_CREDIT}")
    print(f"{args.repeats} x {k} outer folds of users; each trains once on the other users")
    if args.search:
        print(f"each fold's training searches for {args.search:g} s (train --search)")
    results = judge(events, config, outer_folds(users, k, args.repeats), log=print,
                    trainer=trainer_of(args.search))  # fmt: skip
    out = summary(results)
    print()
    print(folds_table(out))
    print("\nThe model's held-out scores over all steps by score decile, pooled over folds:\n")
    print(reliability_table(results))
    print()
    print("\n".join(goal_lines(out, calibrated_ece_over(results, ECE_BOUND))))
    return 0
