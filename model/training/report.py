"""A training run's report on disk: report.json and report.png (loss curves, ROC, the
reliability panel)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from model.calibration import fit_platt
from model.params import pack
from model.training.calibration_fit import cross_fitted
from model.training.evaluate import step_scores
from model.training.train import TrainResult


def write_report(result: TrainResult, directory: str | Path) -> tuple[Path, Path]:
    """report.json and report.png (loss curves; ROC of model and baseline; the reliability
    diagram of the validation users' scores, calibrated and, faintly, raw) in directory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "report.json", out / "report.png"
    json_path.write_text(json.dumps(result.report, indent=2, sort_keys=True))
    epochs = result.report["epochs"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.4))
    x = [e["epoch"] for e in epochs]
    ax1.plot(x, [e["train_loss"] for e in epochs], "o-", label="training")
    ax1.plot(x, [e["validation_loss"] for e in epochs], "o-", label="validation")
    ax1.axvline(result.report["kept_epoch"]["epoch"], color="k", linestyle=":", linewidth=0.8)
    ax1.set(xlabel="epoch", ylabel="per-step log loss", title="Loss (dotted: the epoch kept)")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))  # no epoch 1.5
    ax1.legend()
    for name, (fpr, tpr) in result.curves.items():
        auc = result.report["metrics" if name == "rnn" else "baseline"]["auc_last"]
        ax2.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})")
    ax2.plot([0, 1], [0, 1], "k:", linewidth=0.8)
    ax2.set(xlabel="false positive rate", ylabel="true positive rate",
            title="ROC at each session's last step (validation users)")  # fmt: skip
    ax2.legend(loc="lower right")
    _reliability_panel(ax3, result)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path


def _reliability_panel(ax, result: TrainResult) -> None:
    """The validation users' scores binned: calibrated as reported (cross-fitted), the raw
    head's faintly; at the last step (solid) and over all steps (dashed)."""
    from model.reliability_plot import Curve, draw_reliability

    model, valid = result.model, result.validation_sessions
    title = "Reliability (validation users)"
    if model is None or not valid:
        ax.set(title=title)
        ax.text(0.5, 0.5, "no validation scores", ha="center", va="center")
        return
    params = pack(model.arrays, model.meta.cell, np.float64, model.inputs)
    F = len(model.meta.features)
    raw = step_scores(params, valid, F)
    calibrated = result.report.get("calibration") is not None
    curves = []
    if calibrated:
        platt = result.report["calibration"].get("method") == "platt"
        cal = cross_fitted(params, valid, F, fit_platt if platt else None)
        curves += [Curve("calibrated, last step", cal[2], cal[3], "C0"),
                   Curve("calibrated, all steps", cal[0], cal[1], "C1", dashed=True)]  # fmt: skip
    name = "raw" if calibrated else "raw (not calibrated)"
    curves += [Curve(f"{name}, last step", raw[2], raw[3], "C0", faint=calibrated),
               Curve(f"{name}, all steps", raw[0], raw[1], "C1", faint=calibrated,
                     dashed=True)]  # fmt: skip
    draw_reliability(ax, curves, title + (", calibrated cross-fitted" if calibrated else ""))
