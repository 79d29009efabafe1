"""The promotion gate, one for every way a model becomes current (docs/models.md, The promotion
gate): `train --promote` compares the candidate with the current model on train's validation
users, `model promote` and `model publish --promote` on the retained event history; the same
two checks decide, the comparison is printed, `--force` promotes anyway."""

from __future__ import annotations

# A candidate whose ECE over all steps is more than ECE_MARGIN above the current model's, on
# the same users, is not promoted. All steps, not the last: a rule reads the score after
# every event, and the last step (the event before the purchase, known only in hindsight) is
# where a map fitted on all steps is not meant to hold. 0.02: above the spread of ECE between
# equally good models on a few hundred sessions (~0.01), below the drift a threshold notices
# (a rule at 0.8 firing where 76% buy).
GATE_ECE = "ece_all"
ECE_MARGIN = 0.02


def comparison_line(theirs: dict, ours: dict, current: str, label: str) -> str:
    """What the gate compared, in one line (label: whose users, e.g. `validation`)."""
    return (f"{label} AUC last, current version {current} -> candidate: "
            f"{theirs['auc_last']:.4f} -> {ours['auc_last']:.4f}; {label} ECE, current version "
            f"{current} -> candidate: all steps {theirs['ece_all']:.4f} -> "
            f"{ours['ece_all']:.4f}, last step {theirs['ece_last']:.4f} -> "
            f"{ours['ece_last']:.4f} (the gate reads all steps)")  # fmt: skip


def refusals(theirs: dict, ours: dict, current: str, label: str) -> list[str]:
    """The gate's refusals (one line each; none: promote): an AUC at the last step below the
    current model's, or an ECE over all steps more than ECE_MARGIN above it, on the same
    users (label: whose, e.g. `validation`)."""
    out = []
    auc, their_auc = ours["auc_last"], theirs["auc_last"]
    if not auc >= their_auc:  # a NaN AUC never promotes
        out.append(
            f"not promoted: {label} AUC {auc:.4f} is below current version {current}'s "
            f"{their_auc:.4f} on the same users (--force promotes anyway)"
        )
    ece, their_ece = ours[GATE_ECE], theirs[GATE_ECE]
    if ece > their_ece + ECE_MARGIN:
        out.append(
            f"not promoted: {label} calibration error (ECE, all steps) {ece:.4f} is more than "
            f"{ECE_MARGIN} above current version {current}'s {their_ece:.4f} on the same users "
            "(--force promotes anyway)"
        )
    return out


def history_gate(reg, candidate: str, model, force: bool, say=print) -> list[str]:
    """The gate of `model promote` and `model publish --promote`: the candidate version (its
    loaded `model`) and the current one scored on the retained event history, each with its
    own vocabulary, features and label; the comparison printed; the refusals returned (none
    with `force`, without a current model, or without sessions of both outcomes to compare
    on, which is said)."""
    from model.artifact import DEFAULT_LABEL_TYPE, label_type_of
    from model.training.evaluate import metrics_of, model_step_scores
    from model.training.sessions import sessionize
    from worker.common.partition_count import recorded_partitions
    from worker.lifecycle.history import read_history

    current = reg.current()
    if current is None or current == candidate:
        return []
    models = {"current": reg.load(current), "candidate": model}
    partitions = recorded_partitions(reg.r, reg.keys) or 1
    events, _ = read_history(reg.r, reg.prefix, partitions, fields=None)
    metrics, sizes = {}, set()
    for role, model in models.items():
        m = model.meta
        sessions = sessionize(events, m.event_types, m.features, m.session_gap_seconds,
                              label_type_of(model, DEFAULT_LABEL_TYPE), model.inputs)  # fmt: skip
        if len({s.label for s in sessions}) < 2:
            say(f"gate: the retained history holds no sessions of both outcomes for the "
                f"{role} model ({len(sessions)} sessions): nothing to compare on, promoting "
                "without a comparison")  # fmt: skip
            return []
        metrics[role] = metrics_of(*model_step_scores(model, sessions))
        sizes.add(len(sessions))
    say(f"gate: both models scored on the retained history's {'/'.join(map(str, sorted(sizes)))}"
        " sessions")  # fmt: skip
    say(comparison_line(metrics["current"], metrics["candidate"], current, "retained-history"))
    if force:
        return []
    return refusals(metrics["current"], metrics["candidate"], current, "retained-history")
