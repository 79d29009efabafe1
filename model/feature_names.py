"""The numeric features a model may declare, by name: plain data, no kernels, so the command
line names them without importing Numba (model/features.py computes them)."""

from __future__ import annotations

# name -> what the column holds; the artifact lists the names its model uses, in order.
KNOWN_FEATURES = {
    "gap": "log1p of the seconds since the user's previous event (0 for the first)",
}
