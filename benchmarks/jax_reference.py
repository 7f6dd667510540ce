"""The JAX side of ``bench_compiled.py``: Entropy-MCMC and BlackJAX's SGLD on the same logistic
regression, written as well as JAX allows.

- ``jit`` over a ``lax.scan`` of the iterations; the minibatch gather ``X[idx]`` inside the scan.
- The epoch permutations are drawn before the timer, as ``(iterations, B)`` indices per chain
  (per-chain minibatches) or one ``(iterations, B)`` array that every chain reads (shared).
- Compiled once, then timed as the best of several calls.

Each function returns seconds per call of ``iterations`` iterations of ``chains`` chains (``None``
chains: one chain, no ``vmap``).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np

import jax
import jax.numpy as jnp


def epoch_indices(n: int, batch: int, iterations: int, rng: np.random.Generator) -> np.ndarray:
    """``(iterations, batch)`` minibatch indices, epoch-wise shuffled (as ``EpochBatcher``)."""
    per = n // batch
    perms = [rng.permutation(n)[: per * batch] for _ in range(-(-iterations // per))]
    return np.concatenate(perms).reshape(-1, batch)[:iterations]


def _potential(X, y, batch: int, prior_var: float):
    n = X.shape[0]

    def potential(w, b, idx):
        logits = X[idx] @ w + b
        nll = jnp.sum(jax.nn.softplus(logits) - y[idx] * logits)
        return 0.5 * (w @ w + b * b) / prior_var + (n / batch) * nll

    return potential


def entropy_chain(X, y, batch: int, step: float, eta: float, prior_var: float):
    """``chain(key, indices) -> w``: Entropy-MCMC (SGLD on θ and θa), as ``EntropySGLD`` steps."""
    grad = jax.grad(_potential(X, y, batch, prior_var), argnums=(0, 1))
    d, noise = X.shape[1], math.sqrt(2 * step)

    def body(carry, idx):
        w, b, wa, ba, key = carry
        key, k1, k2, k3, k4 = jax.random.split(key, 5)
        gw, gb = grad(w, b, idx)
        w_new = w - step * (gw + (w - wa) / eta) + noise * jax.random.normal(k1, (d,))
        b_new = b - step * (gb + (b - ba) / eta) + noise * jax.random.normal(k2, ())
        wa = wa - step * (wa - w) / eta + noise * jax.random.normal(k3, (d,))
        ba = ba - step * (ba - b) / eta + noise * jax.random.normal(k4, ())
        return (w_new, b_new, wa, ba, key), None

    def chain(key, indices):
        zero = jnp.zeros(d)
        return jax.lax.scan(body, (zero, 0.0, zero, 0.0, key), indices)[0][0]

    return chain


def blackjax_sgld_chain(X, y, batch: int, step: float, prior_var: float):
    """``chain(key, indices) -> w``: BlackJAX's SGLD on the same potential."""
    import blackjax
    from blackjax.sgmcmc.gradients import grad_estimator

    n, d = X.shape

    def logprior(p):
        return -0.5 * (p["w"] @ p["w"] + p["b"] ** 2) / prior_var

    def loglikelihood(p, datum):
        x, t = datum
        logit = x @ p["w"] + p["b"]
        return t * logit - jax.nn.softplus(logit)

    sgld = blackjax.sgld(grad_estimator(logprior, loglikelihood, n))

    def body(carry, idx):
        position, key = carry
        key, sub = jax.random.split(key)
        return (sgld.step(sub, position, (X[idx], y[idx]), step), key), None

    def chain(key, indices):
        start = sgld.init({"w": jnp.zeros(d), "b": jnp.zeros(())})
        return jax.lax.scan(body, (start, key), indices)[0][0]["w"]

    return chain


def seconds_per_call(chain, iterations: int, batch: int, n: int, chains: Optional[int], shared: bool,
                     repeats: int = 3, seed: int = 0) -> float:
    """Best of ``repeats`` timed calls (after one compiling call) of ``iterations`` iterations."""
    rng = np.random.default_rng(seed)
    if chains is None:
        fn = jax.jit(chain)
        args = (jax.random.PRNGKey(seed), jnp.asarray(epoch_indices(n, batch, iterations, rng)))
    elif shared:  # one minibatch per step, read by every chain
        fn = jax.jit(jax.vmap(chain, in_axes=(0, None)))
        args = (jax.random.split(jax.random.PRNGKey(seed), chains),
                jnp.asarray(epoch_indices(n, batch, iterations, rng)))
    else:  # each chain its own epoch permutations
        fn = jax.jit(jax.vmap(chain))
        args = (jax.random.split(jax.random.PRNGKey(seed), chains),
                jnp.asarray(np.stack([epoch_indices(n, batch, iterations, rng) for _ in range(chains)])))
    jax.block_until_ready(fn(*args))  # compile
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best
