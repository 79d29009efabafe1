"""The rule form: its inputs named like `intentstream rules set`'s flags (name, above,
rearm_below, cooldown, min_events, types), read into the same pydantic Rule the CLI builds
(worker/rules/definition.py, make_rule), and a rule back into the form's values."""

from __future__ import annotations

from worker.commands.rules import number
from worker.rules.definition import Rule, RuleError, format_duration, make_rule, parse_duration

FIELDS = ("name", "above", "rearm_below", "cooldown", "min_events", "types")


def _float(form: dict[str, str], name: str) -> float | None:
    text = form.get(name, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise RuleError(f"{name}: {text!r} is not a number") from None


def rule_of_form(form: dict[str, str]) -> Rule:
    """The Rule a form describes, validated as `rules set` validates its flags; RuleError
    (one line naming the field) otherwise."""
    above = _float(form, "above")
    if above is None:
        raise RuleError("above: required (fire when the score after an event is >= above)")
    min_events_text = form.get("min_events", "").strip() or "1"
    try:
        min_events = int(min_events_text)
    except ValueError:
        raise RuleError(f"min_events: {min_events_text!r} is not a whole number") from None
    types = tuple(t.strip() for t in form.get("types", "").split(",") if t.strip())
    return make_rule(
        name=form.get("name", "").strip(),
        above=above,
        rearm_below=_float(form, "rearm_below"),
        cooldown_ms=parse_duration(form.get("cooldown", "").strip() or "0"),
        min_events=min_events,
        types=types,
    )


def form_of_rule(rule: Rule) -> dict[str, str]:
    """A rule as the form's values (durations as `rules set --cooldown` reads them)."""
    return {
        "name": rule.name,
        "above": number(rule.above),
        "rearm_below": "" if rule.rearm_below is None else number(rule.rearm_below),
        "cooldown": format_duration(rule.cooldown_ms),
        "min_events": str(rule.min_events),
        "types": ",".join(rule.types),
    }


def form_values(form: dict[str, str]) -> dict[str, str]:
    """The form's own fields as typed, to fill it again after a refusal."""
    return {name: form.get(name, "") for name in FIELDS}
