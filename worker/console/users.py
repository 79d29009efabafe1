"""A user's page: the state Redis holds (one HGETALL of the user's key, no scan) and the
kept session replayed through the current model: the score after each event and the
leave-one-out reasons `intentstream explain` prints."""

from __future__ import annotations

from model.explain import leave_one_out, scores_after_each
from worker.commands.explain import explanation_report, read_state
from worker.console.current_model import CurrentModel
from worker.engine.compute.actions import session_of
from worker.lifecycle.registry import Registry


def user_view(registry: Registry, models: CurrentModel, user: str) -> dict | None:
    """What the page shows of `user`, or None when Redis holds no state for them."""
    state = read_state(registry, user)
    if state is None:
        return None
    view: dict = {
        "user_id": user,
        "partition": state.partition,
        "stored_score": None if state.score != state.score else state.score,  # NaN: none
        "state_model": state.model,
        "events": [],
        "reasons": [],
        "notes": [],
    }
    scoring = models.get()
    if scoring is None:
        view["notes"].append("no current model in the registry: nothing to replay")
        return view
    if not len(state.recent):
        view["notes"].append("no recent events kept for this user (history-events is 0)")
        return view
    session = session_of(state.recent, scoring)
    (ex,) = leave_one_out(scoring, [session])
    report = explanation_report(user, state, scoring, ex)
    after = scores_after_each(scoring, session)
    for event, score in zip(report["events"][-len(after) :], after, strict=True):
        event["score_after"] = float(score)
    return view | {k: report[k] for k in ("events", "reasons", "notes", "model", "score_all")}
