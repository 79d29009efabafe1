"""The numeric features a model may declare, by name: plain data, no kernels, so the command
line names them without importing Numba (model/features.py computes them)."""

from __future__ import annotations

# name -> what the column holds; the artifact lists the names its model uses, in order.
KNOWN_FEATURES = {
    "gap": "log1p of the seconds since the user's previous event (0 for the first)",
    "session_events": "log1p of the session's events so far, this one included",
    "session_seconds": "log1p of the seconds since the session's first event",
    "earlier_sessions": "log1p of the user's sessions before this one",
    "gap_before_session": "log1p of the seconds between the previous session and this one",
}
# name:TYPE -> one column per event type of the model's vocabulary
TYPED_FEATURES = {
    "session_count": "log1p of the session's events of TYPE so far, this one included",
    "earlier_count": "log1p of the user's events of TYPE in earlier sessions",
}
# the session memory's first columns, then two blocks of one column per type (model/features.py)
_FIXED = ("session_events", "session_seconds", "earlier_sessions", "gap_before_session")
# what `--features session` stands for, the typed ones once per type of the vocabulary
SESSION_FEATURES = ("gap", "session_events", "session_seconds", "earlier_sessions",
                    "gap_before_session")  # fmt: skip


def unknown_features(names: list[str], event_types: list[str] | None) -> list[str]:
    """The names that are neither a known feature nor `session_count:T`/`earlier_count:T` for
    a type T of event_types (any non-empty T when event_types is None)."""
    types = None if event_types is None else set(event_types)
    return [n for n in names if n not in KNOWN_FEATURES and not _typed(n, types)]


def _typed(name: str, types: set[str] | None) -> bool:
    kind, sep, t = name.partition(":")
    return bool(sep) and kind in TYPED_FEATURES and bool(t) and (types is None or t in types)


def is_stateful(names: list[str]) -> bool:
    """Whether any feature needs the user's session memory (any but `gap`)."""
    return any(n != "gap" for n in names)


def expand_features(names: list[str], event_types: list[str], label_type: str = "") -> list[str]:
    """`session` replaced by the whole session set for this vocabulary (the rest kept, in
    order, without repeats). The label's own session count is left out: training's inputs
    stop before the label event, so its weights would never learn."""
    out: list[str] = []
    typed = [f"{kind}:{t}" for kind in TYPED_FEATURES for t in event_types]
    for n in names:
        group = [n]
        if n == "session":
            group = [*SESSION_FEATURES, *(f for f in typed if f != f"session_count:{label_type}")]
        out += [g for g in group if g not in out]
    return out


def feature_help() -> str:
    """The known names, for --help."""
    return ", ".join([*KNOWN_FEATURES, *(f"{k}:TYPE" for k in TYPED_FEATURES)]) + (
        "; 'session' for all of them"
    )


def memory_width(event_types: list[str]) -> int:
    """Floats of a user's session memory for a vocabulary (its unknown row included)."""
    return len(_FIXED) + 2 * (len(event_types) + 1)


def memory_column(name: str, event_types: list[str]) -> int:
    """Where a session feature's running value sits in the memory (ValueError if unknown)."""
    if name in _FIXED:
        return _FIXED.index(name)
    kind, _, t = name.partition(":")
    if kind in TYPED_FEATURES and t in event_types:
        block = list(TYPED_FEATURES).index(kind)
        return len(_FIXED) + block * (len(event_types) + 1) + event_types.index(t)
    raise ValueError(f"unknown feature {name!r}; known: {list(KNOWN_FEATURES)}")
