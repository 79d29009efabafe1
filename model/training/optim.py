"""Optimisers over the artifact's named arrays: SGD and Adam, updated in place."""

from __future__ import annotations

import numpy as np


class SGD:
    """θ ← θ - lr · g."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        for name, g in grads.items():
            params[name] -= self.lr * g


class Adam:
    """Adam (Kingma & Ba, 2015) with bias correction."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.t = 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        c1 = 1 - self.beta1**self.t
        c2 = 1 - self.beta2**self.t
        for name, g in grads.items():
            m = self.m.setdefault(name, np.zeros_like(g))
            v = self.v.setdefault(name, np.zeros_like(g))
            m *= self.beta1
            m += (1 - self.beta1) * g
            v *= self.beta2
            v += (1 - self.beta2) * g * g
            params[name] -= (self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)).astype(g.dtype)


def make_optimizer(name: str, lr: float) -> SGD | Adam:
    """An optimiser by name: adam or sgd."""
    if name == "adam":
        return Adam(lr)
    if name == "sgd":
        return SGD(lr)
    raise ValueError(f"unknown optimizer {name!r}; use adam or sgd")
