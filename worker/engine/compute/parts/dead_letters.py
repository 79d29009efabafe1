"""The dead letters part: each entry no event could be made of, with its reason, appended to
the partition's dead-letter stream (docs/contract.md, Dead letters)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from worker.common.keys import Keys
from worker.engine.compute.batch import DeadLetter
from worker.engine.compute.parts.part import Command, Part, Share
from worker.engine.compute.stages import ModelRun, Run

log = logging.getLogger("intentstream.worker")

# Field/value pairs kept of one dead letter; values are cut to `max_value_bytes` besides.
MAX_DEAD_FIELDS = 32


def cut(value: bytes, limit: int) -> bytes:
    """A value cut to `limit` bytes."""
    return value if len(value) <= limit else value[:limit]


def dead_letter_items(dead: DeadLetter, max_value_bytes: int) -> list[bytes]:
    """One dead letter as the commit writes it: pair count, source_id, error, pairs.

    Names and values are cut to max_value_bytes; a cut value's original length is kept
    beside it in a field `<name>:bytes`, and pairs beyond MAX_DEAD_FIELDS are dropped
    (the error says so)."""
    pairs = list(zip(dead.fields[::2], dead.fields[1::2], strict=False))
    error = dead.error
    if len(pairs) > MAX_DEAD_FIELDS:
        error += f" (only the first {MAX_DEAD_FIELDS} of {len(pairs)} fields kept)"
        pairs = pairs[:MAX_DEAD_FIELDS]
    flat: list[bytes] = []
    for name, value in pairs:
        short = cut(name, max_value_bytes)
        flat += [short, cut(value, max_value_bytes)]
        if len(value) > max_value_bytes:
            flat += [short + b":bytes", str(len(value)).encode()]
    head = [str(len(flat) // 2).encode(), dead.source_id, cut(error.encode(), max_value_bytes)]
    return [*head, *flat]


@dataclass
class DeadLetters(Part):
    """A batch's dead letters; its stream is watched by every commit."""

    partition: int
    letters: list[DeadLetter]

    def watched(self, keys: Keys, p: int) -> list[str]:
        return [keys.deadletter(p)]

    def writes(self, keys: Keys, p: int, limits: Any) -> list[Command]:
        out = []
        for dead in self.letters:
            _, source_id, error, *pairs = dead_letter_items(dead, limits.deadletter_max_value_bytes)
            out.append(("XADD", keys.deadletter(p), "MAXLEN", "~", limits.deadletter_maxlen, "*",
                        "source_id", source_id, "error", error, *pairs))  # fmt: skip
        return out

    def count(self, metrics: Any, quality: Any) -> None:
        if self.letters:
            log.info("dead-lettered entries",
                     extra={"partition": self.partition, "count": len(self.letters)})  # fmt: skip

    def share(self, s: Share) -> DeadLetters:
        return DeadLetters(s.batch.partition, s.batch.dead)  # a group's batch has none


def dead_letters_stage(run: Run, runs: list[ModelRun]) -> DeadLetters:
    """The stage: the entries the parse turned into dead letters."""
    return DeadLetters(run.batch.partition, run.batch.dead)
