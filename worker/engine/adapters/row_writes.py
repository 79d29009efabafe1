"""A commit's writes of its rows as RESP templates and commands: a score entry's XADD per
score row; per state row the DEL of a key rewritten whole, the HSET of the state in its layout
(the full layout's with event_ids or without; the lean layout's packed `s`: docs/contract.md,
The lean layout), each part's commands (the shadow model's HSET), the TTL. Committer packs a
commit's; group_packing.py lays the templates over a group's rows at once."""

from __future__ import annotations

import numpy as np

from worker.engine.adapters.resp import Joined, resp_commands
from worker.engine.compute.lean_state import packed_states
from worker.engine.compute.pipeline import Commit


def scores_template(c: Commit, text: list[str], stream: object, lean: bool) -> list:
    """The score entries' XADD template: to `stream` (a key, or a key per entry), user_id,
    score, event_id[, type, ts], model, and the parts' fields (the shadow model's score and
    version); the lean layout without type and ts."""
    users = [c.users[i] for i in c.score_user.tolist()]
    template = ["XADD", stream, "*", "user_id", users, "score", text, "event_id",
                c.score_event_ids]  # fmt: skip
    if not lean:
        template += ["type", c.score_types, "ts", c.score_ts]
    template += ["model", c.model]
    for part in c.parts:
        template += part.score_fields()
    return template


def state_writes(
    c: Commit, keys: list[str], text: list[str], rows: np.ndarray, dels: np.ndarray, lean: bool,
    ttl_ms: int,
) -> tuple[list, int, int, np.ndarray]:  # fmt: skip
    """The writes of the state rows `rows` (keys: one per state row of `c`; text: its scores
    as decimals): the DELs of `dels`, the HSETs, the parts', the TTLs. Their bytes, their
    number of commands, the first HSET's place among them, and the state row of each HSET in
    order."""
    hsets, hset_rows = _hsets(c, keys, text, rows, lean)
    parts = [resp_commands(["DEL", keys], dels), *hsets]
    n = len(dels) + len(rows)
    for part in c.parts:
        for template in part.state_writes(keys):
            parts.append(resp_commands(template, rows))
            n += len(rows)
    if ttl_ms > 0:
        parts.append(resp_commands(["PEXPIRE", keys, ttl_ms], rows))
        n += len(rows)
    return parts, n, len(dels), hset_rows


def _hsets(
    c: Commit, keys: list[str], text: list[str], rows: np.ndarray, lean: bool
) -> tuple[list, np.ndarray]:
    """The HSETs of the states of `rows` (chunks), and the state row of each in order: in the
    full layout those with producer event ids first (a state without any has no event_ids
    field)."""
    with_ids, without = state_templates(c, keys, text, bool(c.rewrite), lean)
    if without is None:  # lean: one template
        return [resp_commands(with_ids, rows)], rows
    stamped = np.fromiter(map(bool, c.event_ids), bool, len(c.event_ids))[rows]
    rows_with, rows_without = rows[stamped], rows[~stamped]
    return (
        [resp_commands(with_ids, rows_with), resp_commands(without, rows_without)],
        np.concatenate([rows_with, rows_without]),
    )  # fmt: skip


def state_templates(
    c: Commit, keys: list[str], text: list[str], rewrite: bool, lean: bool
) -> tuple[list, list | None]:  # fmt: skip
    """The states' HSET templates over `keys` (one per state row): the full layout's for the
    states with producer event ids and for those without (h, score, last_id, last_ts, model,
    n, recent, event_ids, the parts' fields: rules when set, items when written); the lean
    layout's one (score, model, s) and None. `rewrite`: some keys are rewritten whole (the
    parts' fields say)."""
    scores = [text[i] for i in c.last_scored.tolist()]  # each user's last score
    if lean:
        k = len(c.users)
        rules = c.rules if c.rules is not None else [b""] * k
        items = c.items if c.items is not None else [b""] * k
        packed = packed_states(c.h, c.last_ts, c.n,
                               [c.last_ids, c.event_ids, c.recent, rules, items])  # fmt: skip
        return ["HSET", keys, "score", scores, "model", c.model, "s", Joined(*packed)], None
    head = ["HSET", keys, "h", c.h, "score", scores, "last_id", c.last_ids, "last_ts",
            c.last_ts, "model", c.model, "n", c.n, "recent", c.recent]  # fmt: skip
    tail = [x for part in c.parts for x in part.state_fields(rewrite)]
    return [*head, "event_ids", c.event_ids, *tail], [*head, *tail]
