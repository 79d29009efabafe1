"""The item memories part: each written user's item memories (compute/items.py) in their
state's `items` field, written when a scoring model declares item inputs, else carried as
read, so the cache holds what Redis does."""

from __future__ import annotations

from dataclasses import dataclass

from worker.engine.compute.items import packed_items
from worker.engine.compute.parts.part import Part, Share
from worker.engine.compute.stages import ModelRun, Run


@dataclass
class ItemMemories(Part):
    """Each written row's `items` field, and whether the commit writes it."""

    items: list[bytes]
    write: bool

    def state_fields(self, rewrite: bool) -> list:
        """The field when the models declare item inputs, and when a state is rewritten
        whole (its memories, carried as read, would go with the key)."""
        return ["items", self.items] if self.write or rewrite else []

    def share(self, s: Share) -> ItemMemories:
        return ItemMemories(self.items[s.rows], self.write)


def item_memories_stage(run: Run, runs: list[ModelRun]) -> ItemMemories:
    """The stage: every model's memories packed (under their input names, the current
    model's first where both declare one, so the shadow's flags survive batches before its
    promotion), else the rows' fields as read."""
    kept: dict = {}
    for m in reversed(runs):
        kept.update(m.memory or {})
    if kept:
        return ItemMemories(packed_items(kept, run.touched), True)
    return ItemMemories([run.states.items[s] for s in run.touched_list], False)
