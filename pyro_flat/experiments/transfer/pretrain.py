"""The transfer study's pre-trained network: trained once on the pre-training classes, cached in ``--out`` as
``pretrained.pt`` and reused by the next run into the same folder (:func:`pretrained_network`), and the network of
each transfer task made from it (:func:`task_network`: a new zero head).

The pre-training is plain PyTorch: SGD with Nesterov momentum 0.9, weight decay 5e-4, minibatch 128 and a cosine
learning rate over ``pretrain_epochs``, from ``--seed``'s initialisation. The cache records what it was made of (the
network, its parameters' shapes, the classes, a digest of the images, the epochs and the learning rate): a cache of
another network is refused by name; one of the same network with other settings is replaced, and the log says so.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

from ...storage.draws_folder import write_atomically
from ..images.study import network
from ..output import StudyError
from .config import TransferConfig
from .data import TransferData

CACHE_NAME = "pretrained.pt"


def _recipe(config: TransferConfig, data: TransferData) -> dict:
    p = config.protocol()
    net = network(p["network"], data.X_pretrain.shape[1], len(data.pretrain_classes))
    return {"network": p["network"], "shapes": {k: list(v.shape) for k, v in net.state_dict().items()},
            "classes": list(data.pretrain_classes), "data": data.digest(), "epochs": int(p["pretrain_epochs"]),
            "lr": float(p["pretrain_lr"]), "seed": config.seed}


def _train(config: TransferConfig, data: TransferData, device: torch.device, log: Callable[[str], None]
           ) -> Tuple[torch.nn.Module, float]:
    p = config.protocol()
    torch.manual_seed(config.seed)
    net = network(p["network"], data.X_pretrain.shape[1], len(data.pretrain_classes)).to(device)
    X, y = data.X_pretrain.to(device), data.y_pretrain.to(device)
    batch, epochs = min(128, len(X)), int(p["pretrain_epochs"])
    steps = epochs * (len(X) // batch)
    optimiser = torch.optim.SGD(net.parameters(), lr=float(p["pretrain_lr"]), momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    generator = torch.Generator().manual_seed(config.seed)
    net.train()
    for epoch in range(epochs):
        order = torch.randperm(len(X), generator=generator).to(device)
        for i in range(len(X) // batch):
            rows = order[i * batch:(i + 1) * batch]
            loss = torch.nn.functional.cross_entropy(net(X[rows]), y[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
        if not math.isfinite(float(loss.detach())):
            raise StudyError(f"the pre-training diverged at epoch {epoch + 1} (loss {float(loss.detach())}): lower the "
                             "preset's pre-training learning rate")
    return net.eval(), float(loss.detach())


def held_out_accuracy(net: torch.nn.Module, data: TransferData) -> float:
    """The pre-trained network's accuracy on the pre-training classes' held-out images (the OOD set)."""
    with torch.no_grad():
        device = next(net.parameters()).device
        return float((net(data.X_ood.to(device)).argmax(-1).cpu() == data.y_ood).float().mean())


def pretrained_network(config: TransferConfig, data: TransferData, staging: Path, device: torch.device,
                       log: Callable[[str], None], kept: Optional[Path] = None) -> Tuple[torch.nn.Module, dict]:
    """The network pre-trained on ``data``'s pre-training classes, from ``--out``'s cache when it holds this
    recipe (or with ``--resume``, the copy in the checkpoint folder ``kept`` a stopped run left), else trained now;
    written to ``staging`` (the run's folder) and to ``kept`` either way. ``(network, record)``."""
    recipe = _recipe(config, data)
    cache = Path(config.out).expanduser() / CACHE_NAME
    if kept is not None and (kept / CACHE_NAME).is_file() and config.resume:
        cache = kept / CACHE_NAME
    if cache.is_file():
        try:
            saved = torch.load(cache, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 -- a damaged file: one line, not a traceback
            raise StudyError(f"{cache} is not a readable pre-trained cache ({type(err).__name__}: {err}); delete it "
                             "or pass another --out") from None
        mine = saved.get("recipe", {})
        if mine.get("network") != recipe["network"] or mine.get("shapes") != recipe["shapes"]:
            raise StudyError(f"{cache} holds a pre-trained {mine.get('network', 'unknown network')} whose parameters "
                             f"do not match this run's {recipe['network']} for {len(data.pretrain_classes)} classes: "
                             f"pass another --out, or delete {cache} to pre-train again")
        changed = [k for k in recipe if k not in ("network", "shapes") and mine.get(k) != recipe[k]]
        if not changed:
            net = network(recipe["network"], data.X_pretrain.shape[1], len(data.pretrain_classes))
            net.load_state_dict(saved["state_dict"])
            record = {**saved["record"], "cached": True}
            for folder in (staging, kept):
                if folder is not None and folder / CACHE_NAME != cache:
                    write_atomically(folder / CACHE_NAME, lambda file: torch.save(saved, file))
            log(f"pre-trained {recipe['network']} from {cache} (held-out accuracy {record['accuracy']:.4f})")
            return net.to(device).eval(), record
        log(f"{cache} was pre-trained with other {', '.join(changed)}: pre-training again")
    start = time.perf_counter()
    net, loss = _train(config, data, device, log)
    record = {"network": recipe["network"], "epochs": recipe["epochs"], "images": len(data.X_pretrain),
              "seconds": time.perf_counter() - start, "final_loss": loss, "accuracy": held_out_accuracy(net, data),
              "cached": False}
    saved = {"recipe": recipe, "record": record, "state_dict": {k: v.cpu() for k, v in net.state_dict().items()}}
    for folder in (staging, kept):
        if folder is not None:
            write_atomically(folder / CACHE_NAME, lambda file: torch.save(saved, file))
    log(f"pre-trained {recipe['network']} on {len(data.X_pretrain):,} images of classes "
        f"{data.pretrain_classes[0]}-{data.pretrain_classes[-1]} in {record['seconds']:.0f} s (held-out accuracy "
        f"{record['accuracy']:.4f})")
    return net, record


def last_stage(net: torch.nn.Module) -> str:
    """The name of the network's last residual stage (``layer3`` of the small ResNets, ``layer4`` of ResNet-18)."""
    return f"layer{net.num_stages}"


def task_network(pretrained: torch.nn.Module, num_classes: int) -> torch.nn.Module:
    """A copy of ``pretrained`` with a new head for ``num_classes`` classes, its weights and bias zero (its output
    starts uniform; the prior centred on the module's values centres the head at 0)."""
    net = copy.deepcopy(pretrained)
    head = torch.nn.Linear(net.linear.in_features, num_classes).to(net.linear.weight.device)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    net.linear = head
    return net


def load_weights(net: torch.nn.Module, weights: Dict[str, torch.Tensor]) -> torch.nn.Module:
    """A copy of ``net`` with the parameters named in ``weights`` set to them (the others as they are)."""
    net = copy.deepcopy(net)
    with torch.no_grad():
        params = dict(net.named_parameters())
        for name, value in weights.items():
            params[name].copy_(value)
    return net


def head_features(net: torch.nn.Module, batchnorm_data: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """``features(X)``: the inputs of ``net.linear`` for ``X``, every BatchNorm layer with its statistics over
    ``batchnorm_data`` (:func:`~pyro_flat.nn.update_batchnorm`, computed once), as a
    :class:`~pyro_flat.nn.BayesianModule` of ``net`` predicts."""
    from ...nn import BayesianModule, update_batchnorm

    model = BayesianModule(net, prior=1.0, sampled=["linear.*"])
    weights = {k: p.detach()[None] for k, p in net.named_parameters() if k in model.shapes}
    statistics = update_batchnorm(model, weights, batchnorm_data) if model.batchnorm_layers else {}
    fixed = copy.deepcopy(net).eval()
    fixed.load_state_dict({k: v[0] for k, v in statistics.items()}, strict=False)
    captured = []
    fixed.linear.register_forward_hook(lambda module, args, out: captured.append(args[0].detach()))

    def features(X: torch.Tensor) -> torch.Tensor:
        captured.clear()
        with torch.no_grad():
            fixed(X)
        return captured[0]

    return features


__all__ = ["pretrained_network", "task_network", "last_stage", "load_weights", "head_features", "CACHE_NAME"]
