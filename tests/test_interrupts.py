"""Ctrl-C held back across a registry step: the step finishes, then KeyboardInterrupt (the
console script's exit 130); without a Ctrl-C nothing changes, and the handler comes back."""

from __future__ import annotations

import os
import signal

import pytest

from worker.commands.interrupts import held_interrupts


def test_a_ctrl_c_inside_waits_for_the_end_of_the_block():
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt), held_interrupts() as got:
        os.kill(os.getpid(), signal.SIGINT)
        done.append("published")  # the step goes on past the signal
        done.append("promoted")
        assert got == [signal.SIGINT]
    assert done == ["published", "promoted"]
    assert signal.getsignal(signal.SIGINT) is before


def test_without_a_ctrl_c_the_block_runs_as_it_is():
    before = signal.getsignal(signal.SIGINT)
    with held_interrupts() as got:
        pass
    assert got == [] and signal.getsignal(signal.SIGINT) is before


def test_an_error_inside_is_the_error_not_an_interrupt():
    with pytest.raises(ValueError), held_interrupts():
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("a failed write")
