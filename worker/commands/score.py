"""The `intentstream score` command: JSON-lines events scored offline, each user's state in
memory, one JSON line out per event. A model that declares inputs (format 2) reads each of
them from the line's top-level key of that name (absent: missing); other keys are ignored."""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque

import numpy as np

from model.artifact import ArtifactError, load_model
from model.scoring import InMemoryScorer, ScoringModel
from worker.commands.event_files import chunks, recording_fields, reported_events


def cmd_score(args: argparse.Namespace) -> int:
    """The `intentstream score` command; returns its exit code."""
    try:
        scoring = ScoringModel(load_model(args.model), raw=args.raw)
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scoring.warm_up()
    scorer = InMemoryScorer(scoring)
    source = open(args.events, encoding="utf-8") if args.events else sys.stdin  # noqa: SIM115
    # Interactive stdin: score each line as it comes instead of waiting for a full batch.
    batch = 1 if source.isatty() else args.batch_size
    bad = 0
    names = scoring.input_names
    fields: deque[dict] = deque()  # the declared fields of each line read, in order
    lines = recording_fields(source, fields, names) if names else source
    with source:
        for chunk in chunks(reported_events(lines, sys.stderr), batch):
            # one recorded entry per event of the chunk (a bad line's too), none left over
            mine = [fields.popleft() for _ in chunk] if names else []
            good = [e for e in chunk if e is not None]
            bad += len(chunk) - len(good)
            if not good:
                continue
            inputs = None
            if names:
                kept = [f for f, e in zip(mine, chunk, strict=True) if e is not None]
                inputs = {n: [f.get(n) for f in kept] for n in names}
            ts = np.fromiter((-1 if e.ts is None else e.ts for e in good), np.int64, len(good))
            scores = scorer.score([e.user_id for e in good], [e.type for e in good], ts, inputs)
            out = [
                json.dumps({"user_id": e.user_id, "type": e.type, "score": float(s)})
                for e, s in zip(good, scores, strict=True)
            ]
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()
    if bad:
        print(f"{bad} bad line(s) skipped", file=sys.stderr)
        return 1
    return 0
