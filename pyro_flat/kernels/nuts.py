r"""The No-U-Turn trajectory (Hoffman & Gelman 2014) with multinomial sampling (Betancourt 2017).

One transition from position :math:`q` with momentum :math:`r`: the trajectory doubles, in a random
direction each time, until its ends turn back towards each other,
:math:`(M^{-1}r_-)\cdot\rho < 0` or :math:`(M^{-1}r_+)\cdot\rho < 0` with :math:`\rho` the summed
momenta (checked on every subtree, so no subtree is ever a U-turn), until an energy error above
``max_energy_error`` (divergence), or until ``2**max_tree_depth`` steps. The next state is drawn
from the trajectory's points with weights :math:`e^{-H}`, progressively biased towards the newest
subtree. One chain: tensors are ``(1, D)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .integrators import leapfrog


@dataclass
class _Tree:
    left: tuple  # (q, r, grad) at each end
    right: tuple
    proposal: tuple  # (q, energy, grad, extra) of the point drawn from this subtree
    log_weight: float
    momentum_sum: torch.Tensor
    turning: bool
    diverging: bool
    accept_sum: float  # sum over points of min(1, exp(H0 - H))
    size: int


def nuts_transition(q, momentum, energy, grad, extra, step_size, velocity: Callable, kinetic: Callable,
                    potential: Callable, max_tree_depth: int = 10, max_energy_error: float = 1000.0):
    """One NUTS transition. ``potential(q) -> (energy, grad, extra)``; ``extra`` travels with the
    chosen point (e.g. the model's own energy and gradient, so nothing is evaluated twice).

    Returns ``(q, energy, grad, extra, accept_prob, num_steps, diverging, tree_depth)``.
    """
    h0 = float(energy + kinetic(momentum))
    start = (q, momentum, grad)
    tree = _Tree(start, start, (q, energy, grad, extra), 0.0, momentum, False, False, 0.0, 0)
    proposal, log_weight = tree.proposal, 0.0
    momentum_sum, depth, steps, accept_sum, diverging = momentum, 0, 0, 0.0, False
    for depth in range(max_tree_depth):
        forward = bool(torch.rand(()) < 0.5)
        edge = tree.right if forward else tree.left
        sub = _build(edge, depth, forward, step_size, h0, velocity, kinetic, potential, max_energy_error)
        steps += sub.size
        accept_sum += sub.accept_sum
        if sub.diverging:
            diverging = True
            break
        if sub.turning:
            break
        # biased progressive sampling: prefer the new subtree (Betancourt 2017, A.3.2)
        if math.log(float(torch.rand(()))) < sub.log_weight - log_weight:
            proposal = sub.proposal
        log_weight = _logaddexp(log_weight, sub.log_weight)
        left, right = (tree.left, sub.right) if forward else (sub.left, tree.right)
        momentum_sum = momentum_sum + sub.momentum_sum
        tree = _Tree(left, right, proposal, log_weight, momentum_sum, False, False, 0.0, 0)
        if _u_turn(left[1], right[1], momentum_sum, velocity):
            break
    q1, e1, g1, x1 = proposal
    return q1, e1, g1, x1, accept_sum / max(steps, 1), steps, diverging, depth + 1


def _build(edge, depth, forward, step_size, h0, velocity, kinetic, potential, max_energy_error) -> _Tree:
    if depth == 0:
        q, r, grad = edge
        eps = step_size if forward else -step_size
        extra = {}

        def tracked(position):
            energy, g, x = potential(position)
            extra["energy"], extra["x"] = energy, x
            return energy, g

        q1, r1, energy, g1 = leapfrog(q, r, grad, eps, 1, velocity, tracked)
        h = float(energy + kinetic(r1))
        delta = h - h0
        diverging = not math.isfinite(delta) or delta > max_energy_error
        log_weight = -delta if math.isfinite(delta) else -math.inf
        accept = 0.0 if not math.isfinite(delta) else min(1.0, math.exp(min(0.0, -delta)))
        point = (q1, r1, g1)
        return _Tree(point, point, (q1, energy, g1, extra["x"]), log_weight, r1, False, diverging,
                     accept, 1)
    first = _build(edge, depth - 1, forward, step_size, h0, velocity, kinetic, potential, max_energy_error)
    if first.turning or first.diverging:
        return first
    second = _build(first.right if forward else first.left, depth - 1, forward, step_size, h0,
                    velocity, kinetic, potential, max_energy_error)
    log_weight = _logaddexp(first.log_weight, second.log_weight)
    # uniform multinomial inside a subtree
    take_second = math.log(float(torch.rand(()))) < second.log_weight - log_weight
    proposal = second.proposal if take_second else first.proposal
    left, right = (first.left, second.right) if forward else (second.left, first.right)
    momentum_sum = first.momentum_sum + second.momentum_sum
    turning = second.turning or _u_turn(left[1], right[1], momentum_sum, velocity)
    return _Tree(left, right, proposal, log_weight, momentum_sum, turning,
                 second.diverging, first.accept_sum + second.accept_sum, first.size + second.size)


def _u_turn(r_left: torch.Tensor, r_right: torch.Tensor, momentum_sum: torch.Tensor, velocity) -> bool:
    return bool((velocity(r_left) * momentum_sum).sum() <= 0) or bool((velocity(r_right) * momentum_sum).sum() <= 0)


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))
