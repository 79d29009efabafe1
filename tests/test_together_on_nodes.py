"""A round's nodes at low traffic (flow.together_on_nodes): each node's exchange runs as steps,
every node's sends go before any node waits for its replies, and one node's error waits for
the others to settle their round."""

from __future__ import annotations

import pytest

from worker.common.settings import Settings
from worker.engine.flow import BatchFlow


def flow_with_steps(steps_of) -> BatchFlow:
    """A BatchFlow whose nodes' exchanges are `steps_of(batches)` (generators)."""
    flow = BatchFlow(Settings(), None, True, None, lambda: None, lambda *a: None)
    flow._together_steps = steps_of
    return flow


def test_every_node_sends_before_any_node_waits():
    log: list[str] = []

    def steps(batches):
        node = batches[0]
        for phase in ("reads", "checks", "transactions"):
            log.append(f"{node} sends {phase}")
            yield
            log.append(f"{node} reads {phase}")

    flow_with_steps(steps).together_on_nodes([["a"], ["b"], ["c"]])
    for phase in ("reads", "checks", "transactions"):
        sent = max(log.index(f"{n} sends {phase}") for n in "abc")
        assert sent < min(log.index(f"{n} reads {phase}") for n in "abc")
    assert len(log) == 18  # every step of every node ran


def test_a_nodes_error_is_raised_after_the_others_settled():
    settled: list[str] = []

    def steps(batches):
        node = batches[0]
        yield
        if node == "b":
            raise ConnectionError("b's node went away")
        yield
        settled.append(node)

    with pytest.raises(ConnectionError, match="b's node"):
        flow_with_steps(steps).together_on_nodes([["a"], ["b"], ["c"]])
    assert settled == ["a", "c"]


def test_an_interrupt_closes_the_nodes_still_in_flight():
    closed: list[str] = []

    def steps(batches):
        node = batches[0]
        try:
            yield
            if node == "a":
                raise KeyboardInterrupt
            yield
        except GeneratorExit:
            closed.append(node)  # where together.py disconnects what is in flight
            raise

    with pytest.raises(KeyboardInterrupt):
        flow_with_steps(steps).together_on_nodes([["a"], ["b"], ["c"]])
    assert closed == ["b", "c"]
