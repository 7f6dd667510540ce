r"""Ready-made Pyro models of the studies.

Bayesian logistic regression with a Gaussian prior,

.. math:: w \sim \mathcal N(0, \sigma_p^2 I_d),\quad b \sim \mathcal N(0, \sigma_p^2),\quad
          y_i \mid x_i \sim \mathrm{Bernoulli}(\mathrm{sigmoid}(x_i^\top w + b)),

written with a subsampled ``pyro.plate`` so that the stochastic-gradient kernels draw fresh
minibatches (``batch_size=None``: full batch, as Pyro's NUTS and HMC need).

>>> import torch, pyro
>>> X, y = torch.randn(50, 3), torch.randint(0, 2, (50,)).float()
>>> trace = pyro.poutine.trace(logistic_regression).get_trace(X, y, batch_size=10)
>>> sorted(n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"])
['b', 'data', 'features', 'w']
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from typing import Dict, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F

import pyro
import pyro.distributions as dist
from pyro.nn import PyroModule, PyroSample

from ..targets import EpochBatcher
from ..validation import check_positive


def logistic_regression(X: torch.Tensor, y: Optional[torch.Tensor] = None, *,
                        batch_size: Optional[int] = 100, prior_scale: float = 1.0) -> None:
    """Bayesian logistic regression; sites ``w`` (shape ``(d,)``), ``b``, plate ``data``, obs ``y``.

    The weights live in a ``features`` plate, so the model broadcasts over a leading chain
    dimension (``w``: ``(C, d)``, ``b``: ``(C, 1)``) for vectorized chains and
    ``Predictive(parallel=True)``; with per-chain minibatches the plate's indices are ``(C, B)``
    and the gathered data ``(C, B, d)``, one minibatch per chain.
    """
    if not X.is_floating_point():
        raise TypeError(f"logistic_regression: X must be a floating-point tensor, got dtype {X.dtype}; convert it "
                        "and choose its scale, e.g. X.float() / 255 for 0..255 pixels.")
    if not torch.is_tensor(prior_scale):
        check_positive("prior_scale", prior_scale, hint="It is the prior sd of w and b, e.g. prior_scale=1.0.")
    if y is not None:
        y = _bernoulli_labels(y, X.dtype)
    zero = X.new_zeros(())
    with pyro.plate("features", X.shape[1]):
        w = pyro.sample("w", dist.Normal(zero, prior_scale))
    b = pyro.sample("b", dist.Normal(zero, prior_scale))
    subsample = None if batch_size is None else min(batch_size, X.shape[0])
    with pyro.plate("data", X.shape[0], subsample_size=subsample, device=X.device) as idx:
        if subsample is None or subsample >= X.shape[0]:  # full batch: no copy of X
            logits = w @ X.T + b
        elif idx.dim() == 1:  # one minibatch (for every chain)
            logits = w @ take_rows(X, idx).T + b
        elif idx.shape[0] >= 16 and X.shape[0] <= 16 * subsample:
            # many chains, each its own minibatch, few data: all logits in one matrix product, then
            # each chain's (gathering a (C, B, d) block costs more here: 2 ms against 23-41 ms for
            # 128 chains, N = 800)
            logits = (w @ X.T).gather(-1, idx) + b
        else:  # each chain its own minibatch: a (C, B, d) block, one batched matrix product (compiled, 4
            # chains: the likelihood's gradient 4x, a whole EntropySGLD iteration 2.6x faster than multiplying
            # and summing, whose backward inductor turns into a slow reduction)
            logits = (w.unsqueeze(-2) @ take_rows(X, idx).transpose(-1, -2)).squeeze(-2) + b
        if y is not None and subsample is not None and subsample < X.shape[0]:
            y = take_rows(y, idx)
        pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)


#: the last labels found to be 0 and 1 (checked once per tensor, not at every evaluation)
_LABELS = [lambda: None]


def _bernoulli_labels(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0/1 labels (integer, bool or float) as ``dtype`` (a Bernoulli observation is a float); a
    ``ValueError`` naming ``y`` for other values (0.5 is no Bernoulli label)."""
    if _LABELS[0]() is not y:
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"logistic_regression: y must hold the labels 0 and 1 (Bernoulli), got the values "
                             f"{y.unique()[:10].tolist()}; map the classes to 0 and 1, e.g. y = (labels == 9).")
        _LABELS[0] = weakref.ref(y)
    return y if y.is_floating_point() else y.to(dtype)


def take_rows(data: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``data[idx]`` along the first dimension for 1-D or ``(C, B)`` indices: shape
    ``idx.shape + data.shape[1:]``. The same as ``data[idx]``, through ``index_select``, which is
    several times faster than advanced indexing in eager torch. Indices on another device than the
    data (a model's ``pyro.plate`` without ``device=``) are moved to the data's.

    >>> take_rows(torch.arange(10.0), torch.tensor([[0, 1], [8, 9]])).tolist()
    [[0.0, 1.0], [8.0, 9.0]]
    """
    return data.index_select(0, idx.reshape(-1).to(data.device)).reshape(idx.shape + data.shape[1:])


def logistic_probs(samples: Dict[str, torch.Tensor], X: torch.Tensor, *, suffix: str = "") -> torch.Tensor:
    r"""``P(y = 1 | x, w_s, b_s)`` for every draw at once: shape ``(num_draws, n)``.

    ``suffix="_aux"`` uses the guiding draws θa. Averaging over the first axis is the Bayesian
    model average (:func:`pyro_flat.bma_predict` gives the same for any model, draw by draw).
    """
    w, b = samples["w" + suffix], samples["b" + suffix]
    w = w.reshape(-1, w.shape[-1]).to(X.dtype)
    return torch.sigmoid(w @ X.T + b.reshape(-1, 1).to(X.dtype))


class LogisticRegressionPotential:
    r"""The potential of :func:`logistic_regression` as a plain batched function, for many chains.

    .. math:: U(\theta) = \sum_{i \in \text{batch}} \tfrac{N}{B}\,\mathrm{softplus}(-s_i\,x_i^\top\theta)
              + \tfrac12 \sum_j \lambda_j \theta_j^2,\qquad s_i = 2y_i - 1,

    over one site ``"theta"`` of shape ``(d,)`` or ``(C, d)`` (the intercept is a column of ``X``:
    with ``X = [X_w, 1]`` and ``λ = 1/prior_scale²`` it is the model's potential at
    ``θ = (w, b)``). ``batch_size=B`` draws each chain's minibatch from its own epoch-wise
    permutation (:class:`~pyro_flat.targets.EpochBatcher`), so chains are independent; the
    :mod:`pyro_flat.theory` problems use it to run hundreds of chains at once.

    >>> U = LogisticRegressionPotential(torch.ones(4, 2), torch.tensor([1.0, 0, 1, 0]), 1.0)
    >>> U({"theta": torch.zeros(3, 2)})
    tensor([2.7726, 2.7726, 2.7726])
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, prior_precision, batch_size: Optional[int] = None):
        self.X, self.signs = X, 2 * y.to(X.dtype) - 1
        self.precision = torch.as_tensor(prior_precision, dtype=X.dtype, device=X.device).expand(X.shape[1])
        if not bool((torch.isfinite(self.precision) & (self.precision >= 0)).all()):
            raise ValueError(f"prior_precision must be finite and >= 0 (1 / prior_scale**2), got {prior_precision!r}.")
        self.batch_size = None if batch_size is None or batch_size >= X.shape[0] else int(batch_size)
        self._batches: Optional[EpochBatcher] = None

    def __call__(self, params: Dict[str, torch.Tensor]) -> torch.Tensor:
        theta = params["theta"]
        W = theta.reshape(-1, theta.shape[-1])  # (C, d)
        if self.batch_size is None:
            nll = F.softplus(-self.signs * (W @ self.X.T)).sum(-1)
        else:
            if self._batches is None or self._batches.num_chains != W.shape[0]:
                self._batches = EpochBatcher(self.X.shape[0], self.batch_size, self.X.device, W.shape[0])
            idx = self._batches()  # (C, B)
            logits = torch.einsum("cbd,cd->cb", self.X[idx], W)
            nll = F.softplus(-self.signs[idx] * logits).sum(-1) * (self.X.shape[0] / self.batch_size)
        energy = nll + 0.5 * (W * W * self.precision).sum(-1)
        return energy.reshape(theta.shape[:-1])


class BayesianClassifier(PyroModule):
    r"""What the Bayesian classifiers share: Gaussian priors on every weight and bias (sites
    ``layers.{l}.weight`` / ``layers.{l}.bias``), MC-dropout's switch and the data plate.

    A subclass builds ``self.layers`` and writes :meth:`logits`. With ``dropout=p`` the input of every
    layer after the first is zeroed unit by unit with probability p (the others scaled by 1/(1-p)) in
    every forward pass, training and prediction alike: MC-dropout (Gal & Ghahramani 2016). ``with
    net.without_dropout():`` gives the deterministic network (for Hessians). The weights are drawn
    before the plate is entered (a ``PyroSample`` read inside a plate would be batched over the data).
    """

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1), got dropout={dropout!r}: it is the chance "
                             "that a hidden unit is zeroed (0 turns MC-dropout off; e.g. dropout=0.1)")
        self.dropout = float(dropout)
        self._dropout_on = True

    def _gaussian_priors(self, prior_scale: float) -> None:
        """Every layer's weight and bias become ``Normal(0, prior_scale)`` sample sites."""
        check_positive("prior_scale", prior_scale, hint="It is the prior sd of every weight, e.g. prior_scale=0.1.")
        for layer in self.layers:
            # the prior's scale is a buffer, so that ``net.to("cuda")`` or ``net.double()`` moves the prior too
            layer.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
            for name in ("weight", "bias"):
                shape = tuple(getattr(layer, name).shape)
                setattr(layer, name, PyroSample(
                    lambda m, shape=shape: dist.Normal(0.0, m.prior_scale).expand(shape).to_event(len(shape))))

    @property
    def num_weights(self) -> int:
        """The number of weights and biases: the dimension of the posterior."""
        return sum(math.prod(shape) for shape in self._shapes)

    def _dropped(self, h: torch.Tensor) -> torch.Tensor:
        return F.dropout(h, self.dropout, training=True) if self.dropout > 0 and self._dropout_on else h

    def logits(self, X: torch.Tensor, weights=None) -> torch.Tensor:
        raise NotImplementedError

    @contextmanager
    def without_dropout(self) -> Iterator["BayesianClassifier"]:
        """The deterministic network inside the block (dropout's expectation, by the 1/(1-p) scaling)."""
        before, self._dropout_on = self._dropout_on, False
        try:
            yield self
        finally:
            self._dropout_on = before

    def forward(self, X: torch.Tensor, y: Optional[torch.Tensor] = None, *,
                batch_size: Optional[int] = None) -> None:
        weights = [(layer.weight, layer.bias) for layer in self.layers]  # drawn outside the plate
        subsample = None if batch_size is None or batch_size >= X.shape[0] else int(batch_size)
        with pyro.plate("data", X.shape[0], subsample_size=subsample, device=X.device) as idx:
            if subsample is not None:  # (B,) indices, or (C, B) with per-chain minibatches
                X, y = take_rows(X, idx), None if y is None else take_rows(y, idx)
            pyro.sample("y", dist.Categorical(logits=self.logits(X, weights)), obs=y)


class BayesianMLP(BayesianClassifier):
    r"""A Bayesian multilayer perceptron for classification, as a ``PyroModule``.

    .. math:: W_l \sim \mathcal N(0, \sigma_p^2),\quad b_l \sim \mathcal N(0, \sigma_p^2),\quad
              y_i \mid x_i \sim \mathrm{Categorical}\big(\mathrm{softmax}(f_W(x_i))\big),

    with ``tanh`` hidden layers. With ``dropout=p`` each hidden unit is zeroed with probability p
    (and the others scaled by 1/(1-p)) in every forward pass, training and prediction alike:
    MC-dropout (Gal & Ghahramani 2016). Fit it as a MAP (``AutoDelta`` and ``Trace_ELBO``, or
    ``SAM_ELBO`` for SA-MC-dropout); each draw of ``Predictive`` or :func:`~pyro_flat.bma_predict`
    then uses a fresh mask. ``with net.without_dropout():`` gives the deterministic network (for
    Hessians). Sites ``layers.{l}.weight`` / ``layers.{l}.bias``; the data sit in
    a ``pyro.plate("data", N, subsample_size=batch_size)``. The weights are drawn before the plate
    is entered (a ``PyroSample`` read inside a plate would be batched over the data). The network
    broadcasts over a leading chain dimension, so several chains run vectorized.

    >>> net = BayesianMLP(4, [8], 3)
    >>> trace = pyro.poutine.trace(net).get_trace(torch.randn(10, 4), torch.randint(0, 3, (10,)))
    >>> [n for n, s in trace.nodes.items() if s["type"] == "sample" and not s["is_observed"]][:2]
    ['layers.0.weight', 'layers.0.bias']
    """

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int, *, prior_scale: float = 0.1,
                 dropout: float = 0.0):
        super().__init__(dropout)
        sizes = [int(in_features), *map(int, hidden), int(num_classes)]
        self._shapes = [s for a, b in zip(sizes[:-1], sizes[1:]) for s in ((b, a), (b,))]
        self.layers = PyroModule[torch.nn.ModuleList]([
            PyroModule[torch.nn.Linear](a, b) for a, b in zip(sizes[:-1], sizes[1:])
        ])
        self._gaussian_priors(prior_scale)

    def logits(self, X: torch.Tensor, weights=None) -> torch.Tensor:
        """Class logits, shape ``(N, K)``, or ``(C, N, K)`` for weights with a leading chain dim.

        Weights laid out as Pyro's ``vectorize_particles`` lays them out (``(C, 1, out, in)``:
        chains, then the data plate's singleton) give one row of logits per chain, so
        ``pyro_flat.MCMC(..., num_chains=C)`` runs the chains as one batched network.
        """
        weights = [(layer.weight, layer.bias) for layer in self.layers] if weights is None else weights
        h = X
        for i, (w, b) in enumerate(weights):
            h = _linear(h, w, b)
            if i + 1 < len(weights):
                h = self._dropped(torch.tanh(h))
        return h


class BayesianCNN(BayesianClassifier):
    r"""A small Bayesian convolutional network for square grey images given as flat rows (MNIST's 784
    pixels), as a ``PyroModule``: for each of ``channels`` a 3x3 convolution of stride 2 (padding 1,
    halving the side) and ReLU, then a linear head on the flattened maps; ``Normal(0, prior_scale)``
    on every weight and bias, no BatchNorm. The strided convolutions downsample in place of pooling
    (the all-convolutional net of Springenberg et al. 2015): on a CPU, 3x3 convolutions of stride 1
    followed by 2x2 max-pooling made a gradient step 53x slower. The rest is :class:`BayesianMLP`'s:
    sites ``layers.{l}.weight`` / ``layers.{l}.bias`` (the convolutions first, the head last),
    :meth:`logits` with the same vectorized-chain layout (a convolution's weight ``(C, 1, out, in, 3,
    3)``: the C chains run as one grouped convolution), and MC-dropout on every hidden feature map with
    ``dropout=p``.

    >>> net = BayesianCNN(784, (4, 8), 5)      # 28x28 -> 4 maps of 14x14 -> 8 maps of 7x7 -> 5 classes
    >>> net.num_weights, tuple(net.logits(torch.rand(3, 784)).shape)
    (2301, (3, 5))
    """

    def __init__(self, in_features: int, channels: Sequence[int], num_classes: int, *, prior_scale: float = 0.1,
                 dropout: float = 0.0):
        super().__init__(dropout)
        self.side = math.isqrt(int(in_features))
        channels = [int(c) for c in channels]
        if self.side ** 2 != in_features or self.side < 2 or not channels or min(channels) < 1:
            raise ValueError(f"BayesianCNN takes square images as rows of side^2 pixels and one or more channel "
                             f"counts >= 1; got {in_features} inputs and channels {channels}")
        sizes = [1, *channels]
        side = self.side
        convs = [PyroModule[torch.nn.Conv2d](a, b, 3, stride=2, padding=1) for a, b in zip(sizes[:-1], sizes[1:])]
        for _ in channels:
            side = (side + 1) // 2
        head = PyroModule[torch.nn.Linear](channels[-1] * side * side, int(num_classes))
        self.layers = PyroModule[torch.nn.ModuleList]([*convs, head])
        self._shapes = [s for layer in self.layers for s in (tuple(layer.weight.shape), tuple(layer.bias.shape))]
        self._gaussian_priors(prior_scale)

    def logits(self, X: torch.Tensor, weights=None) -> torch.Tensor:
        """Class logits, shape ``(N, K)``, or ``(C, N, K)`` for weights with a leading chain dim, as
        :meth:`BayesianMLP.logits`; ``X`` is ``(N, side²)``, or ``(C, N, side²)`` (a minibatch per chain)."""
        weights = [(layer.weight, layer.bias) for layer in self.layers] if weights is None else weights
        *convs, (head_w, head_b) = weights
        chains = _conv_chains(convs[0][0])
        count = math.prod(chains)
        images = X.reshape(*X.shape[:-1], self.side, self.side)
        # the networks side by side as channel groups: (N, count * channels, side, side)
        h = images.unsqueeze(-3) if not chains else (
            images.reshape(count, -1, self.side, self.side).transpose(0, 1) if X.dim() > 2
            else images.unsqueeze(1).expand(-1, count, -1, -1))
        for w, b in convs:
            w = w.reshape(-1, *w.shape[-3:])
            h = self._dropped(torch.relu(F.conv2d(h, w, b.reshape(-1), stride=2, padding=1, groups=count)))
        if chains:  # (N, count * c, s, s) -> (*chains, N, c * s * s)
            h = h.reshape(h.shape[0], count, -1).transpose(0, 1).reshape(*chains, h.shape[0], -1)
        return _linear(h.flatten(-3) if not chains else h, head_w, head_b)


def _conv_chains(weight: torch.Tensor) -> tuple:
    """The chain dims of a convolution's weight: ``()`` for ``(out, in, k, k)``, ``chains`` for
    ``(*chains, 1, out, in, k, k)`` (:func:`_linear`'s layout)."""
    if weight.dim() == 4:
        return ()
    if weight.shape[-5] != 1:
        raise ValueError(
            f"BayesianCNN got a weight of shape {tuple(weight.shape)}; a batched weight must be "
            f"(*chains, 1, out, in, k, k), the 1 standing for the data plate (Pyro's vectorize_particles "
            f"layout). Pass one draw at a time, or add the singleton with weight.unsqueeze(-5)")
    return tuple(weight.shape[:-5])


def _linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``h @ weight.T + bias`` for one weight matrix or a batch of them.

    A batched weight has shape ``(*chains, 1, out, in)``: the ``1`` is the data plate's slot
    (``vectorize_particles`` layout). Dropping it puts the chain dims left of the data dim:
    ``(N, in) @ (*chains, in, out) -> (*chains, N, out)``, and the bias ``(*chains, 1, out)``
    broadcasts over the data as it is.
    """
    if weight.dim() == 2:
        return F.linear(h, weight, bias)
    if weight.shape[-3] != 1:
        raise ValueError(
            f"BayesianMLP got a weight of shape {tuple(weight.shape)}; a batched weight must be "
            f"(*chains, 1, out, in), the 1 standing for the data plate (Pyro's vectorize_particles "
            f"layout). Pass one draw at a time, or add the singleton with weight.unsqueeze(-3)")
    return torch.matmul(h, weight.squeeze(-3).transpose(-1, -2)) + bias
