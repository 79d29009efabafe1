"""The models that score: the current one and a shadow, the states they read, and their
swaps between batches as the model source says (a file or the registry).

A hidden state belongs to a state space: a model's meta's `state_space` (a model trained
from another's weights continues its space), else its version. States carry over a swap only
when the new model continues the old one's space; else the cached states are dropped and
each user's state is rebuilt at their next event from their recent events (or restarts from
zero without them), counted by the state reads (adapters/states.py).

Also the process settings the kernel's loop runs best with, measured (pin_blas, tune_gc).
"""

from __future__ import annotations

import gc
import logging

import redis
from threadpoolctl import threadpool_limits

from model import input_bytes
from model.artifact import state_space_of
from model.scoring import ScoringModel
from worker.common.settings import Settings
from worker.engine.adapters import resp
from worker.engine.adapters.metrics import WorkerMetrics
from worker.engine.compute import columnar, histories, items, lean_state, resends
from worker.engine.compute import quality as live_quality
from worker.engine.compute.batch import Batch
from worker.engine.compute.joint import Group, build_group
from worker.engine.compute.pipeline import Commit, build_commit
from worker.engine.compute.quality import LiveQuality
from worker.engine.compute.state_cache import StateCache
from worker.engine.compute.user_states import UserStates
from worker.lifecycle.model_source import (
    FileModelSource,
    ModelRejectedError,
    RegistryModelSource,
)
from worker.lifecycle.registry import Registry, RegistryError
from worker.rules import step as rules_step
from worker.rules.step import RuleTable

log = logging.getLogger("intentstream.worker")

# A model's state shape and space, and the shadow model's (shape, space) when one runs: what
# the state reads are given (StateReader.read and .complete).
StateSpec = tuple[tuple[int, int], str, tuple[tuple[int, int], str] | None]


def pin_blas() -> None:
    """One thread for every BLAS library loaded so far, for the rest of the process.

    The kernel's products are small: a second OpenBLAS thread gains nothing and its
    busy-waiting takes the core that Redis and this loop need (2.5-3x slower measured). The
    limit reaches only libraries already loaded, and a kernel loads SciPy's at its first
    call: so call this after warming up."""
    threadpool_limits(limits=1, user_api="blas")


# Young-generation collections every 20,000 net allocations instead of 700: a batch makes
# thousands of short-lived objects that refcounting frees anyway (see tune_gc).
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Freeze the objects made at start (numba, scipy, pydantic: ~170,000, never garbage),
    which every full collection walked: at 50,000 users that was 25% of the loop's time and
    pauses of 0.1-0.2 s (benchmark: 22k events/s before, 31k after, batch p99 133 -> 35 ms)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def state_space(model: ScoringModel) -> str:
    """Which hidden states a model reads: its meta's `state_space` (a model trained from
    another's weights continues its space), else its own version."""
    return state_space_of(model.model.meta.model_extra or {}, model.version)


def warm_up_worker_kernels() -> None:
    """Compile (or load from cache) the worker's own kernels, beside the models': the parse's,
    the resends', the histories', the item memories', the lean layout's, the rules', live
    quality's, the inputs' and the commit framing's. The image's build step calls this too
    (worker/commands/kernels.py)."""
    columnar.warm_up()
    resends.warm_up()
    histories.warm_up()
    items.warm_up()
    lean_state.warm_up()
    rules_step.warm_up()
    live_quality.warm_up()
    input_bytes.warm_up()
    resp.warm_up()


class Models:
    """One worker's current and shadow models, swapped only between batches."""

    def __init__(
        self, source: FileModelSource | RegistryModelSource, client: redis.Redis,
        settings: Settings, metrics: WorkerMetrics, quality: LiveQuality, cache: StateCache,
    ) -> None:  # fmt: skip
        self.source = source
        self.current: ScoringModel = source.current
        self.shadow: ScoringModel | None = source.shadow
        self.r = client
        self.s = settings
        self.metrics = metrics
        self.quality = quality
        self.cache = cache  # dropped when the states it holds are of another space
        self._spaces: dict[str, str] = {}  # state space by model version
        self.rules: RuleTable | None = None  # the intent rules in force (engine/rulebook.py)

    def warm_up(self) -> None:
        """Compile both models' kernels and the worker's own (`warm_up_worker_kernels`), then
        pin BLAS to one thread."""
        self.current.warm_up()
        if self.shadow is not None:
            self.shadow.warm_up()
        warm_up_worker_kernels()
        pin_blas()

    def spec(self) -> StateSpec:
        """The state shape and space the model reads, and the shadow's (or None)."""
        model, shadow = self.current, self.shadow
        shadow_spec = (shadow.state_shape, state_space(shadow)) if shadow is not None else None
        return model.state_shape, state_space(model), shadow_spec

    def build(self, batch: Batch, states: UserStates) -> Commit:
        """A batch's Commit, computed by the models running now."""
        s = self.s
        return build_commit(batch, states, self.current, s.history_events, self.shadow,
                            s.resend_window(), self.rules)  # fmt: skip

    def build_group(
        self, batches: list[Batch], states: list[UserStates], joined: UserStates | None = None
    ) -> Group | None:  # fmt: skip
        """Batches of distinct partitions built as one (compute/joint.py): each one's Commit,
        the group's sums on the first's (the group commits all or nothing); None when they
        cannot be joined. `joined`: their states as one, when read so (`states` its views)."""
        s = self.s
        return build_group(batches, states, self.current, s.history_events, self.shadow,
                           s.resend_window(), self.rules, joined)  # fmt: skip

    def follow(self) -> None:
        """Take a newer model or a changed shadow from the source, if there is one; a model
        the source refuses leaves the running one in place."""
        try:
            newer = self.source.poll()
        except ModelRejectedError as exc:
            self.metrics.model_reloads.labels("rejected").inc()
            log.error("new model refused; the running model stays", extra={"error": str(exc)})
        else:
            if newer is not None:
                self._swap_model(newer)
        if self.source.shadow is not self.shadow:
            self._swap_shadow(self.source.shadow)

    def _swap_model(self, newer: ScoringModel) -> None:
        newer.warm_up()
        pin_blas()
        old = self.current
        self._spaces[old.version] = state_space(old)
        if state_space(newer) != state_space(old):
            self.cache.drop()
        self.current = newer
        self.quality.forget("current")
        self.metrics.model_reloads.labels("loaded").inc()
        self.set_metrics()
        log.info("model swapped", extra={"old": old.version, "new": newer.version})

    def _swap_shadow(self, shadow: ScoringModel | None) -> None:
        """Start, change or stop the shadow model."""
        if shadow is not None:
            shadow.warm_up()
            pin_blas()
        old, self.shadow = self.shadow, shadow
        self.cache.drop()  # cached states hold the old shadow's states (or none)
        self.quality.forget("shadow")
        self.set_metrics()
        versions = {"old": old and old.version, "new": shadow and shadow.version}
        log.info("shadow model changed", extra=versions)

    def set_metrics(self) -> None:
        """The version gauges (0 for a version that is not a number, or no shadow)."""
        version = self.current.version
        self.metrics.model_version.set(int(version) if version.isdigit() else 0)
        shadow = self.shadow.version if self.shadow is not None else "0"
        self.metrics.shadow_version.set(int(shadow) if shadow.isdigit() else 0)

    def input_names(self) -> tuple[str, ...]:
        """The fields the current and the shadow model declare as inputs, each once."""
        models = [m for m in (self.current, self.shadow) if m is not None]
        return tuple(dict.fromkeys(n for m in models for n in m.input_names))

    def space_of(self, version: str) -> str:
        """The state space of the model version that wrote a state: known from models this
        process ran, else from the registry's meta (looked up once); else the version."""
        if version == self.current.version:
            return state_space(self.current)
        if version not in self._spaces:
            try:
                meta = Registry(self.r, self.s.prefix).meta(version)
                self._spaces[version] = state_space_of(meta, version)
            except (RegistryError, redis.ResponseError):
                self._spaces[version] = version
        return self._spaces[version]
