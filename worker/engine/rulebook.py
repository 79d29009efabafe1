"""The intent rules in force: one worker's rule set, swapped between batches as the rule
source says (rules/source.py); a refused set leaves the running one in place."""

from __future__ import annotations

import logging

from worker.engine.adapters.metrics import WorkerMetrics
from worker.rules.source import NO_RULES, RuleSource, RulesRejectedError
from worker.rules.step import RuleTable

log = logging.getLogger("intentstream.worker")


class Rulebook:
    """The rule table the next batch runs with."""

    def __init__(self, source: RuleSource | None, metrics: WorkerMetrics) -> None:
        self.source = source
        self.metrics = metrics
        self.table: RuleTable = NO_RULES

    def follow(self) -> None:
        """Take a changed rule set from the source, if there is one."""
        if self.source is None:
            return
        try:
            newer = self.source.poll()
        except RulesRejectedError as exc:
            self.metrics.rules_reloads.labels("rejected").inc()
            log.error("intent rules refused; the running rules stay", extra={"error": str(exc)})
            return
        if newer is None:
            return
        old, self.table = self.table, newer
        self.metrics.rules_reloads.labels("loaded").inc()
        self.metrics.rules_version.set(newer.version)
        log.info("intent rules changed", extra={"old": old.version, "new": newer.version,
                                                "rules": list(newer.names)})  # fmt: skip

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
