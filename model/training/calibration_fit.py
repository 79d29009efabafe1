"""Fitting the calibration map on the validation users (docs/models.md, What a score means):
isotonic from `calibration_min_sessions` validation sessions on, Platt scaling below when
asked, each shipped only when, cross-fitted (the users split in two, each half scored by the
map fitted on the other), it makes the scores better for users it was not fitted on."""

from __future__ import annotations

import zlib

import numpy as np

from model.calibration import fit_isotonic, fit_platt, knots_for
from model.params import Params
from model.training.evaluate import metrics_of, step_scores
from model.training.sessions import Session


def calibrated_on_validation(
    params: Params, sessions: list[Session], n_features: int, raw_scores, min_sessions: int,
    fallback: str = "none",
):  # fmt: skip
    """The map fitted on all the validation sessions, their cross-fitted calibrated scores,
    and a note. Isotonic from `min_sessions` validation sessions on; below, with `fallback`
    "platt", Platt scaling (two numbers: a few hundred sessions carry them, not isotonic
    blocks). Either ships only
    when, cross-fitted, it lowers the ECE over all steps against the raw head's: a map that
    makes scores worse for users it was not fitted on (a small validation set's noise)
    never ships."""
    isotonic = len(sessions) >= min_sessions
    if not isotonic and fallback == "none":
        return (
            None,
            raw_scores,
            (
                f"not applied: {len(sessions)} validation sessions, fewer than the {min_sessions} "
                "an isotonic map needs (--calibration-min-sessions; its knots would follow their "
                "noise; --calibration-fallback platt tries Platt scaling)"
            ),
        )
    if isotonic:
        fit, why = _isotonic_for(len(sessions)), ""
    else:
        fit, why = fit_platt, (f" (Platt scaling: {len(sessions)} validation sessions, fewer "
                               f"than the {min_sessions} an isotonic map needs)")  # fmt: skip
    fitted = cross_fitted(params, sessions, n_features, fit)
    raw_m = metrics_of(*raw_scores)
    cal_m = metrics_of(*fitted) if fitted is not None else {}
    ece_raw, ece_cal = raw_m["ece_all"], cal_m.get("ece_all", float("nan"))
    # the fallback must also keep the log loss (a proper score): on a few hundred sessions
    # the ECE moves by thousandths with noise alone
    worse_loss = not isotonic and not cal_m.get("logloss_all", np.inf) <= raw_m["logloss_all"]
    if not ece_cal < ece_raw or worse_loss:
        name = "isotonic" if isotonic else "Platt"
        return (
            None,
            raw_scores,
            (
                f"not applied: on held-out users a {name} map would take the ECE over all "
                f"steps from {ece_raw:.4f} to {ece_cal:.4f}"
                + (
                    f" and the log loss from {raw_m['logloss_all']:.4f} to "
                    f"{cal_m.get('logloss_all', float('nan')):.4f}"
                    if not isotonic
                    else ""
                )
                + why
            ),
        )
    cal = fit(raw_scores[1], raw_scores[0])
    return cal, fitted, (f"{cal.method}, {len(cal.x)} knots, from {len(sessions)} validation "
                         f"sessions; cross-fitted ECE over all steps {ece_raw:.4f} -> "
                         f"{ece_cal:.4f}{why}")  # fmt: skip


def _isotonic_for(sessions: int):
    """fit_isotonic with the knots `sessions` held-out sessions carry."""
    return lambda raw, labels: fit_isotonic(raw, labels, knots_for(sessions))


def cross_fitted(params: Params, sessions: list[Session], n_features: int, fit=None):
    """The sessions' calibrated step scores, each fold's (users split in two by a hash of
    their id) from the map `fit` (default isotonic) fitted on the other: the calibration
    measured on users it was not fitted on. None when a fold's map cannot be fitted."""
    fit = fit or _isotonic_for(len(sessions))
    folds = [[s for s in sessions if zlib.crc32(s.user_id.encode()) % 2 == k] for k in (0, 1)]
    if not all(folds) or any(len({s.label for s in f}) < 2 for f in folds):
        scores = step_scores(params, sessions, n_features)  # too few users to cross-fit
        cal = fit(scores[1], scores[0])
        if cal is None:
            return None
        return scores[0], cal.apply(scores[1]), scores[2], cal.apply(scores[3])
    raw = [step_scores(params, fold, n_features) for fold in folds]
    maps = [fit(r[1], r[0]) for r in raw]
    if any(m is None for m in maps):
        return None
    out = [(r[0], maps[1 - k].apply(r[1]), r[2], maps[1 - k].apply(r[3]))
           for k, r in enumerate(raw)]  # fmt: skip
    return tuple(np.concatenate([o[i] for o in out]) for i in range(4))
