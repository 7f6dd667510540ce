r"""Any PyTorch network as a Bayesian model: :class:`BayesianModule`.

.. math:: \theta_j \sim p_j(\theta_j)\ \text{(one site per parameter of the module)},\qquad
          y_i \mid x_i, \theta \sim \text{likelihood}\big(f_\theta(x_i)\big),\quad i \in \text{plate}(N),

with a minibatch of ``batch_size`` rows scaled by :math:`N/B` in the plate, as every pyro-flat model.
The module is not changed: the network runs at the sampled weights through ``torch.func``
(:class:`~pyro_flat.nn.functional.BatchedNetwork`), so ``C`` vectorized chains (weights
``(C, 1, *shape)``, inputs ``(C, B, ...)``) are one ``vmap``-ed pass.

BatchNorm is done as the papers do it. While sampling, each BatchNorm layer normalises with its
minibatch's statistics, and no running statistic is kept, so none is shared between chains or
between θ and θa. For prediction (``y=None``) each draw's statistics are recomputed with a pass of
its network over training data (SWA's ``bn_update``, per draw): pass ``bma_predict(...,
batchnorm_data=X_train)``, or predict inside ``with model.batchnorm_data(X_train):``;
:func:`~pyro_flat.nn.batchnorm.update_batchnorm` gives the statistics themselves.

**Settings for a network.** Give the stochastic-gradient kernels ``temperature=1e-4``, a cold posterior
as in the Entropy-MCMC paper's runs, and ``step_size = lr / N`` for a learning rate ``lr`` of the mean loss
over ``N`` training points (the potential is a sum over the data). At the default temperature 1 the
average of a network's draws is underconfident, the cold-posterior effect: measured when issue 60 was
filed (a BatchNorm CNN on digits), EntropySGLD at temperature 1 gave BMA confidence 0.906 at accuracy 0.963
(ECE 0.061), EntropySGHMC at 1e-4 an ECE of 0.0075 (the numbers are in ``docs/api.md``, "Deep networks").
Chains start from PyTorch's initialisation of the network (:meth:`BayesianModule.initial_params`).

>>> import torch, pyro
>>> from pyro_flat import MCMC, SGLD
>>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
>>> model = BayesianModule(net, prior=1.0, likelihood="categorical")
>>> X, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
>>> mcmc = MCMC(SGLD(model, step_size=1e-3), num_samples=5, warmup_steps=5, num_chains=2,
...             disable_progbar=True)
>>> mcmc.run(X, y, batch_size=16)
>>> mcmc.chain_method, sorted(mcmc.get_samples())[:2]
('vectorized', ['0.bias', '0.weight'])
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from copy import deepcopy
from typing import Callable, Dict, Iterator, Optional, Union

import torch
import pyro
import pyro.distributions as dist
from pyro.nn import PyroModule

from ..models.zoo import take_rows
from ..validation import check_memory, check_positive_int
from .batches import Batches, RowMemo
from .batchnorm import STATISTICS_BATCH, BatchNormStatistics, batchnorm_layers, check_batch_rows, check_batchnorm_inputs
from .execution import MeasuredNetworks, check_memory_format, networks_way
from .functional import BatchedNetwork, probe_inputs, split_batch_dims
from .prior import site_prior
from .selection import Sampled, sampled_parameters, state_weights

Prior = Union[float, Callable[[str, torch.Tensor], dist.Distribution]]
Likelihood = Union[str, Callable[[torch.Tensor], dist.Distribution]]
LIKELIHOODS = ("categorical", "bernoulli")


class BayesianModule(MeasuredNetworks, PyroModule):
    """A Pyro model made from ``module``, callable as ``model(x, y=None, batch_size=None)``.

    :param module: any ``torch.nn.Module`` (it is copied, not changed). Its parameters become the
        sample sites, named as in ``module.named_parameters()`` (``"conv1.weight"``), so a
        ``state_dict`` of the module can start a chain (:meth:`initial_params`).
    :param sampled: which parameters are Bayesian (:mod:`~pyro_flat.nn.selection`): names or fnmatch
        patterns (``"fc.*"``), or a predicate ``(name, parameter) -> bool``; the others stay fixed at the
        module's values (a pre-trained network's). Default: those with ``requires_grad=True`` (any other
        said once, in a warning, unless :func:`~pyro_flat.nn.low_rank_adapters` froze it).
    :param prior_mean: ``"zero"``, or ``"module"``: the Normal of a prior sd centred on the module's
        weights (the pre-trained ones, as transfer learning often does).
    :param prior: ``s`` for ``Normal(0, s)`` on every weight (weight decay ``1/(2 s^2)``; an
        :class:`~pyro_flat.nn.prior.IsotropicNormal` per tensor, one reduction per evaluation), or a callable
        ``(name, parameter) -> distribution`` whose batch and event shapes together are the
        parameter's shape.
    :param likelihood: ``"categorical"`` (the output are class logits), ``"bernoulli"`` (one logit), or
        a callable mapping the output to the distribution of ``y`` (batch shape ending in the data).
    :param transform: a per-minibatch transform of the inputs while sampling (data augmentation, e.g.
        :func:`~pyro_flat.nn.transforms.random_crop_flip`), run on the inputs' device, each image its own; it keeps
        their shape, and its output must be finite (both checked).
        It applies to minibatches (``batch_size`` or :class:`~pyro_flat.nn.Batches`), not to full-data
        passes or predictions, and is drawn once per minibatch: evaluated twice, a minibatch gets the same
        augmented images (SAM's two gradients, the check that chains batch).
    :param networks: how vectorized chains (or blocks of draws) run the network: ``"vmap"`` (one
        ``torch.func.vmap``-ed pass), ``"loop"`` (one network after another, inside the one batched
        kernel), ``"measure"`` (both timed at the first pass of each kind, the faster kept: ``network_choices``), or
        ``"auto"``: measured on a GPU; on a CPU a loop for a network with a convolution, else ``vmap`` (the ways
        measured faster there: :mod:`~pyro_flat.nn.execution`). Each way
        gives every chain its own weights and minibatch; the draws agree up to round-off.
    :param memory_format: ``"channels_last"`` (images in NHWC layout), ``"contiguous"`` or ``"auto"``
        (channels_last on a GPU for a network with a 2-d convolution).

    ``forward`` passes one tensor ``x`` to the module (write a small wrapper for a module of several
    inputs). Chains start, unless ``MCMC`` gets ``initial_params`` or the kernel an ``init_strategy``, from
    the module's own initialisation, independently per chain: :meth:`initial_params` ``(num_chains=C)``
    (chain 0 the module's weights, the others PyTorch's initialisation run again). A draw from the prior
    (``init_strategy=init_to_sample``) is a poor start for a network: measured when issue 60 was filed, a
    BatchNorm CNN on digits reached BMA accuracy 0.41 after 300 steps from it, 0.95 from PyTorch's.
    ``mcmc.summary()`` prints one line per weight: for a network, read ``pyro_flat.to_arviz(mcmc)``
    with ``var_names``.
    """

    def __init__(self, module: torch.nn.Module, *, prior: Prior = 1.0, likelihood: Likelihood = "categorical",
                 transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, networks: str = "auto",
                 sampled: Sampled = None, prior_mean: str = "zero", memory_format: str = "auto"):
        super().__init__()
        if isinstance(module, type) and issubclass(module, torch.nn.Module):
            raise TypeError(f"module must be a network, got the class {module.__name__}: pass an instance, "
                            f"BayesianModule({module.__name__}(...)).")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}; wrap a function of "
                            "the weights as a potential_fn instead.")
        named = list(module.named_parameters())
        if not named:
            raise ValueError(f"module {type(module).__name__} has no parameters: there is nothing to sample. "
                             "Pass the network whose weights the posterior is over.")
        if prior_mean not in ("zero", "module"):
            raise ValueError(f"prior_mean must be 'zero' or 'module' (the module's weights, e.g. pre-trained ones), got "
                             f"{prior_mean!r}.")
        chosen = set(sampled_parameters(module, sampled))
        self.shapes = {n: tuple(p.shape) for n, p in named if n in chosen}
        self.fixed = {n: p.detach() for n, p in named if n not in chosen}
        self.device, self.dtype = named[0][1].device, named[0][1].dtype
        self.priors = {n: site_prior(prior, n, p, centred=prior_mean == "module") for n, p in named if n in chosen}
        if not (callable(likelihood) or likelihood in LIKELIHOODS):
            raise ValueError(f"likelihood must be one of {LIKELIHOODS} or a callable output -> distribution of y, "
                             f"got {likelihood!r}.")
        self.likelihood = likelihood
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable inputs -> inputs, got {type(transform).__name__}.")
        self.transform = transform
        self.networks = networks_way(networks, module, self.device)
        self.memory_format = check_memory_format(memory_format, module, self.device)
        self._memory_format_requested = memory_format
        self.batchnorm_layers = batchnorm_layers(module)
        self._all_batchnorms = batchnorm_layers(module, every=True)  # those that normalise a minibatch by its own
        # plain objects, not submodules: the copies run at the weights they are given
        ways = dict(networks=self.networks, memory_format=self.memory_format)
        object.__setattr__(self, "_sampling", BatchedNetwork(module, batchnorm="batch", **ways))
        object.__setattr__(self, "_predicting", BatchedNetwork(module, batchnorm="running", **ways)
                           if self.batchnorm_layers else None)
        object.__setattr__(self, "_statistics", BatchNormStatistics(module) if self.batchnorm_layers else None)
        object.__setattr__(self, "_module", module)  # for its state_dict
        self._batchnorm_inputs: Optional[torch.Tensor] = None
        self._checked_labels, self._probed, self._transform_checked = None, set(), False
        self._augmented = RowMemo()  # each minibatch row's augmentation, drawn once

    # ----------------------------------------------------------------- the model
    def forward(self, x: Union[torch.Tensor, Batches], y: Optional[torch.Tensor] = None, *,
                batch_size: Optional[int] = None) -> torch.Tensor:
        if isinstance(x, Batches):
            return self._forward_batches(x, y, batch_size)
        self._check_inputs(x, y)
        weights = {n: pyro.sample(n, p) for n, p in self.priors.items()}  # drawn outside the plate
        batch = _common_batch_dims(weights, self.shapes)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer (rows per minibatch, at most the {x.shape[0]} "
                             f"rows of x), got {batch_size!r}.")
        subsample = None if batch_size is None or batch_size >= x.shape[0] else int(batch_size)
        if y is not None or self._predicting is None:  # minibatch statistics
            check_batch_rows(subsample or x.shape[0], self._all_batchnorms,
                             f"batch_size={batch_size}" if subsample else f"x of shape {tuple(x.shape)}")
        full_y = y
        with pyro.plate("data", x.shape[0], subsample_size=subsample, device=x.device) as idx:
            per_network = subsample is not None and idx.dim() > 1  # (C, B) indices: each chain its own rows
            if subsample is not None:
                x, y = take_rows(x, idx), None if y is None else take_rows(y, idx)
                x = self._augment(x, idx)
            out = self.output(weights, x, batch, per_network, predicting=full_y is None)
            return self._observe(out, y, full_y)

    def _forward_batches(self, data: Batches, y, batch_size) -> torch.Tensor:
        """``x`` and ``y`` from a loader (:class:`~pyro_flat.nn.batches.Batches`): one batch per chain and step."""
        if y is not None or batch_size is not None:
            raise ValueError("with x=Batches(loader) the labels and the batch size come from the loader: call "
                             "model(Batches(loader)) without y and batch_size.")
        weights = {n: pyro.sample(n, p) for n, p in self.priors.items()}
        batch = _common_batch_dims(weights, self.shapes)
        check_batch_rows(data.batch_size, self._all_batchnorms, f"the loader's batch_size={data.batch_size}")
        with pyro.plate("data", data.num_data, subsample_size=data.batch_size, device=self.device) as idx:
            x, y = data.take(idx)
            self._check_inputs(x, y, idx.dim())
            out = self.output(weights, self._augment(x, idx), batch, idx.dim() > 1)
            if data.check_pairs is None and self.likelihood in LIKELIHOODS:
                # these batches' labels here, once; every later batch's on the host as the loader yields it, before
                # it moves to the device: no step waits on the device for a check
                self._check_label_values(y, out.shape[-1])
                outputs = out.shape[-1]
                data.check_pairs = lambda x, y: self._check_label_values(y, outputs)
            return self._observe(out, y, None)

    def _augment(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """``transform`` of each minibatch row, drawn once per row of indices: a kernel that evaluates a
        minibatch twice (SAM, the check that chains batch) sees the same augmented images."""
        if self.transform is None:
            return x
        rows = x.reshape(-1, *x.shape[idx.dim() - 1:])  # (rows, B, ...)
        out = self._augmented.rows(idx, lambda r: self._transformed(rows[r]))
        return torch.stack(out).reshape(x.shape)

    def _transformed(self, rows: torch.Tensor) -> torch.Tensor:
        """``transform(rows)``, checked: a tensor of the same shape, finite."""
        out = self.transform(rows)
        if not torch.is_tensor(out) or out.shape != rows.shape:
            raise ValueError(f"transform must return a tensor of its input's shape, here {tuple(rows.shape)}, got "
                             f"{tuple(out.shape) if torch.is_tensor(out) else type(out).__name__}: it runs on minibatches "
                             "only, not on predictions, so a change of shape (a crop, a resize) belongs in the data or "
                             "in the module.")
        # finite: checked on the first minibatch (a check on every one would wait on the device each step)
        if not self._transform_checked and out.is_floating_point() and not bool(torch.isfinite(out).all()):
            raise ValueError(f"transform's output holds {int((~torch.isfinite(out)).sum())} NaN/inf value(s) for finite "
                             "inputs; fix the transform (e.g. a division by a zero spread): it must keep them finite.")
        self._transform_checked = True
        return out

    def _observe(self, out: torch.Tensor, y: Optional[torch.Tensor], full_y: Optional[torch.Tensor]):
        """The ``y`` site: the likelihood of the output, checked against the labels' shape and values."""
        if full_y is not None:
            self._check_labels(full_y, out)
        likelihood = self._likelihood(out)
        if y is not None:
            if self.likelihood == "bernoulli":
                y = y.to(out.dtype)  # 0/1 labels of any dtype
            full = tuple(likelihood.batch_shape) + tuple(likelihood.event_shape)
            if y.dim() > len(full) or tuple(y.shape) != full[len(full) - y.dim():]:
                raise ValueError(
                    f"the likelihood of the network's output has batch shape {tuple(likelihood.batch_shape)} and event "
                    f"shape {tuple(likelihood.event_shape)}, and the minibatch's y has shape {tuple(y.shape)}: they must "
                    "match, one distribution per row, or y would be scored against every row. Pass y of shape (N,) "
                    "(not (N, 1)), and for a one-output network write the likelihood on out.squeeze(-1).")
        return pyro.sample("y", likelihood, obs=y)

    def output(self, weights: Dict[str, torch.Tensor], x: torch.Tensor, batch=(), per_network: bool = False, *,
               predicting: bool = False) -> torch.Tensor:
        """The network's output at ``weights`` (sites as sampled: ``(*batch, 1, *shape)`` or ``shape``)."""
        params = {n: v.reshape(*batch, *self.shapes[n]) for n, v in weights.items()}
        if predicting and self._predicting is not None:
            if self._batchnorm_inputs is None:
                raise ValueError(
                    f"this network has BatchNorm layers ({', '.join(self.batchnorm_layers)}): a prediction needs each "
                    "draw's statistics over training data. Pass bma_predict(..., batchnorm_data=X_train), or predict "
                    "inside `with model.batchnorm_data(X_train):`.")
            stats = self._statistics(params, self._batchnorm_inputs, batch, self.fixed)
            return self._predicting({**params, **stats}, x, batch_dims=batch, per_network_inputs=per_network,
                                    shared=self.fixed)
        return self._sampling(params, x, batch_dims=batch, per_network_inputs=per_network, shared=self.fixed)

    @contextmanager
    def batchnorm_data(self, inputs: torch.Tensor) -> Iterator["BayesianModule"]:
        """Predictions inside the block use each draw's BatchNorm statistics over ``inputs`` (training data)."""
        check_batchnorm_inputs("batchnorm_data", inputs, self.device, self.dtype, self._probe)
        before, self._batchnorm_inputs = self._batchnorm_inputs, inputs
        try:
            yield self
        finally:
            self._batchnorm_inputs = before

    def initial_params(self, state_dict: Optional[Dict[str, torch.Tensor]] = None, *,
                       num_chains: Optional[int] = None) -> Dict[str, torch.Tensor]:
        """Starting weights ``{site: tensor}`` for ``MCMC(..., initial_params=...)``:

        - ``initial_params()``: the module's current weights (each of its parameter's shape);
        - ``initial_params(num_chains=C)``: ``C`` different networks, ``(C, *shape)``: chain 0 has the module's
          current weights, and each chain ``c >= 1`` PyTorch's initialisation run again: on one deep copy of
          the module, ``reset_parameters()`` of every submodule that has one (in ``modules()`` order), once
          per chain, under the current torch random stream (``pyro.set_rng_seed`` repeats them). Where the
          chains start when ``MCMC`` gets no ``initial_params`` (and the kernel no ``init_strategy``). A
          parameter that no ``reset_parameters`` of its module or of a module above it covers keeps the
          module's value in every chain, said in a warning;
        - ``initial_params(state_dict, num_chains=C)``: every chain starts from ``state_dict``'s weights (a
          trained network shared by the chains), whose tensors must have the parameters' shapes.
        """
        if num_chains is not None:
            num_chains = check_positive_int("num_chains", num_chains, hint="It is the number of chains to start.")
            copies = num_chains * (1 if state_dict is not None or num_chains == 1 else 2)  # rows, then stacked
            check_memory("num_chains", copies * sum(map(math.prod, self.shapes.values())) * self.dtype.itemsize,
                         what="starting weights", hint=f"num_chains={num_chains:,} copies of the network's weights: "
                                                       "pass fewer chains.")
        params = state_weights(self._module.state_dict() if state_dict is None else state_dict, self.shapes, self.device)
        if num_chains is None:
            return params
        if state_dict is not None or num_chains == 1:
            return {n: v.expand(num_chains, *v.shape).clone() for n, v in params.items()}
        return {n: torch.stack(rows) for n, rows in zip(params, zip(*self._reinitialised(params, num_chains)))}

    def _reinitialised(self, own: Dict[str, torch.Tensor], num_chains: int) -> list:
        """``own`` (chain 0's weights) and ``num_chains - 1`` networks of PyTorch's initialisation, each a list
        of tensors in ``own``'s order."""
        copy = deepcopy(self._module)
        resets = [m.reset_parameters for m in copy.modules() if callable(getattr(m, "reset_parameters", None))]
        uncovered = [n for n in self.shapes if not any(
            callable(getattr(copy.get_submodule(".".join(n.split(".")[:k])), "reset_parameters", None))
            for k in range(n.count(".") + 1))]
        if uncovered:
            warnings.warn(f"BayesianModule.initial_params: no reset_parameters() covers the parameters {uncovered}, "
                          f"so every chain starts them at the module's values; give their module a "
                          "reset_parameters() (PyTorch's layers have one), or pass initial_params.",
                          UserWarning, stacklevel=3)
        rows = [list(own.values())]
        with torch.no_grad():
            for _ in range(num_chains - 1):
                for reset in resets:
                    reset()
                named = dict(copy.named_parameters())
                rows.append([named[n].detach().clone() for n in own])
        return rows

    def batchnorm_statistics(self, draws: Dict[str, torch.Tensor], inputs: torch.Tensor, *,
                             batch_size: int = STATISTICS_BATCH) -> Dict[str, torch.Tensor]:
        """Each draw's BatchNorm statistics over ``inputs``: ``{buffer: (num_draws, ...)}`` for draws
        ``{site: (num_draws, *shape)}`` (see :func:`~pyro_flat.nn.update_batchnorm`)."""
        if self._statistics is None:
            raise ValueError("this network has no BatchNorm layer with running statistics: there is nothing to update.")
        missing = [n for n in self.shapes if n not in draws]
        if missing:
            raise ValueError(f"draws has no values for the sites {missing}; pass mcmc.get_samples() (θ sites).")
        check_batchnorm_inputs("inputs", inputs, self.device, self.dtype, self._probe)
        batch_size = check_positive_int("batch_size", batch_size, minimum=2, hint="It is the rows per batch of the pass.")
        params = {n: draws[n].reshape(-1, *self.shapes[n]) for n in self.shapes}
        count = next(iter(params.values())).shape[0]
        return self._statistics(params, inputs, (count,), self.fixed, batch_size)

    # ----------------------------------------------------------------- helpers
    def _likelihood(self, out: torch.Tensor) -> dist.Distribution:
        out = out.float() if out.dtype in (torch.bfloat16, torch.float16) else out  # autocast: the loss in fp32
        if self.likelihood == "categorical":
            return dist.Categorical(logits=out)
        if self.likelihood == "bernoulli":
            if out.shape[-1] != 1:
                raise ValueError(f"likelihood='bernoulli' needs a network with one output (a logit); this one has "
                                 f"{out.shape[-1]}: use likelihood='categorical' for {out.shape[-1]} classes.")
            return dist.Bernoulli(logits=out.squeeze(-1))
        d = self.likelihood(out)
        if not isinstance(d, dist.Distribution):
            raise TypeError(f"likelihood must return the distribution of y (e.g. lambda out: "
                            f"dist.Normal(out.squeeze(-1), 0.5)), got {type(d).__name__}.")
        return d

    def _check_inputs(self, x, y, lead: int = 1) -> None:
        if not torch.is_tensor(x):
            raise TypeError(f"x must be a tensor of inputs, got {type(x).__name__}.")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device} and the module on {self.device}: move the data there "
                             f"(x.to({str(self.device)!r})).")
        if x.is_floating_point() and x.dtype != self.dtype:
            raise ValueError(f"x is {x.dtype} and the module's weights {self.dtype}: pass x.to({self.dtype}) (or "
                             "convert the module before wrapping it).")
        if y is not None and (not torch.is_tensor(y) or y.shape[:1] != x.shape[:1] or y.device != x.device):
            raise ValueError(f"y must be a tensor with one label per row of x ({x.shape[0]}) on {x.device}, got "
                             f"{type(y).__name__}{'' if not torch.is_tensor(y) else f' of shape {tuple(y.shape)} on {y.device}'}.")
        if math.prod(x.shape[:lead]) > 1 or not self._all_batchnorms:  # one row and BatchNorm: check_batch_rows
            self._probe("x", x, lead)

    def _probe(self, name: str, x: torch.Tensor, lead: int = 1) -> None:
        """The module run once on two rows of ``x`` per shape and dtype of its rows (:func:`probe_inputs`)."""
        key = (name, tuple(x.shape[lead:]), x.dtype)
        if key not in self._probed:
            probe_inputs((self._predicting or self._sampling).module, name, x, lead)
            self._check_layout(x, lead)
            self._probed.add(key)

    def _check_labels(self, y: torch.Tensor, out: torch.Tensor) -> None:
        if self.likelihood not in LIKELIHOODS or self._checked_labels is y:
            return  # checked once per labels tensor
        self._check_label_values(y, out.shape[-1])
        self._checked_labels = y

    def _check_label_values(self, y: torch.Tensor, outputs: int) -> None:
        """``y``'s values against the likelihood of an output of ``outputs`` values (a host sync on a GPU)."""
        bound = outputs if self.likelihood == "categorical" else 2
        if y.is_floating_point() and self.likelihood == "categorical":
            raise ValueError(f"categorical labels must be integer class indices, got y of dtype {y.dtype}: pass y.long().")
        if self.likelihood == "bernoulli" and not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"y must hold the labels 0 and 1 for likelihood='bernoulli', got the values "
                             f"{y.unique()[:10].tolist()}: map the classes to 0 and 1 (e.g. y = (labels == k).float()), "
                             "or pass a callable likelihood for other values.")
        if bool((y < 0).any() | (y >= bound).any()):
            raise ValueError(f"y holds labels outside 0..{bound - 1} (the {self.likelihood} likelihood of an output "
                             f"with {outputs} values): min {y.min().item()}, max {y.max().item()}, dtype {y.dtype}.")


def _common_batch_dims(weights: Dict[str, torch.Tensor], shapes: Dict[str, tuple]) -> tuple:
    dims = {n: split_batch_dims(v, shapes[n], n) for n, v in weights.items()}
    found = set(dims.values())
    if len(found) > 1:
        raise ValueError(f"the sampled weights disagree on their batch dims: {dims}.")
    return found.pop()


__all__ = ["BayesianModule", "LIKELIHOODS"]
