"""A numeric input's session statistics: the running mean, minimum and maximum of its
standardised value over the session's events so far, the current one included
(model/inputs.py, a numeric input with `session`).

A data scientist's first session features for a price are exactly these (is this product
dearer than what the user looked at before?); a recurrent state can learn a running mean but
not an exact minimum or maximum, and the wide head reads only what x holds. Per user and
input the state keeps four floats, (count, sum, min, max) of the session's present values,
in the session memory's rows (model/artifact.py, memory_rows), so the worker, replays and
training all see the same running values. They restart at a session start (the model's
session rule, the one that clears the item memory); an event without a usable value leaves
them as they were, and while a session has no value yet all three columns are 0 (the
training set's mean).
"""

from __future__ import annotations

import numba as nb


@nb.njit(cache=True)
def write_session_stats(x, at, slot, new_session, stats):
    """Each event's session mean, minimum and maximum into x[e, at + 2 : at + 5], reading its
    standardised value at x[e, at] and missing flag at x[e, at + 1], in order.

    Event e belongs to user slot[e]; new_session[e] clears the user's statistics first.
    stats (U, 4) float32 holds each user's (count, sum, min, max), updated in place."""
    for e in range(slot.shape[0]):
        s = slot[e]
        if new_session[e]:
            for j in range(4):
                stats[s, j] = 0.0
        if x[e, at + 1] == 0.0:
            v = x[e, at]
            if stats[s, 0] == 0.0:
                stats[s, 2] = v
                stats[s, 3] = v
            else:
                stats[s, 2] = min(stats[s, 2], v)
                stats[s, 3] = max(stats[s, 3], v)
            stats[s, 0] += 1.0
            stats[s, 1] += v
        if stats[s, 0] > 0.0:
            x[e, at + 2] = stats[s, 1] / stats[s, 0]
            x[e, at + 3] = stats[s, 2]
            x[e, at + 4] = stats[s, 3]
