r"""A run's fingerprint: what a checkpoint must share with a run to continue it (:func:`run_fingerprint`), each
setting described so that two runs can be compared (:func:`describe`), and what differs, one line per setting
(:func:`differences`). :mod:`pyro_flat.storage.checkpoint` keeps it in the file and refuses another run's.

>>> differences({"kernel": "SGLD", "SGLD.step_size": 0.1}, {"kernel": "SGLD", "SGLD.step_size": 0.2})
['SGLD.step_size: 0.2 here, 0.1 in the checkpoint']
"""

from __future__ import annotations

import functools
import hashlib
from typing import Dict, List

import torch


def describe(value) -> object:
    """A value of a run's configuration as something a checkpoint can compare: numbers and strings as they
    are, tensors by shape, dtype and a hash of their bytes, functions by name, other objects by type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):  # 'torch.bfloat16' (checkpoints written before said 'dtype': _same)
        return str(value)
    if torch.is_tensor(value):
        data = value.detach().cpu().contiguous()
        digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()[:16]
        return f"tensor{tuple(data.shape)} {data.dtype} sha256:{digest}"
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): describe(v) for k, v in value.items()}
    return _describe_object(value, depth=0)


def _describe_object(value, depth: int) -> object:
    """Functions by their code and what they capture (defaults, closure cells), ``functools.partial`` by its
    function and arguments, modules by their weights, other objects by their attributes (a few levels down)."""
    if depth > 3:
        return type(value).__qualname__
    if callable(getattr(value, "fingerprint", None)) and not isinstance(value, type):  # data from a loader
        return describe(value.fingerprint())
    spec = getattr(value, "spec", None)  # a Preconditioner: what it was asked to be
    if spec is not None and not callable(spec):
        return describe(spec)
    if hasattr(value, "__dataclass_fields__"):  # a schedule such as cyclical_cosine: its fields
        return repr(value)
    if isinstance(value, functools.partial):
        return {"partial": _describe_object(value.func, depth + 1), "args": describe(list(value.args)),
                "keywords": describe(value.keywords)}
    code = getattr(value, "__code__", None)
    if code is not None:  # a function or lambda: its code and what it closes over, not its qualified name
        body = hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]
        cells = [_describe_cell(c, depth) for c in (value.__closure__ or ())]
        return {"function": value.__name__, "code": body, "defaults": describe(value.__defaults__),
                "keyword defaults": describe(value.__kwdefaults__), "captured": cells,
                "globals": _describe_globals(code, getattr(value, "__globals__", {}))}
    if isinstance(value, torch.nn.Module):
        return {"module": repr(value), "weights": describe(dict(value.state_dict())),
                "attributes": _describe_attributes(value, depth)}
    if hasattr(value, "__dict__"):
        return {"object": type(value).__qualname__, "attributes": _describe_attributes(value, depth)}
    return type(value).__qualname__


def _describe_globals(code, names: dict) -> dict:
    """The module-level numbers, strings and tensors a function's code (and the code nested in it) reads."""
    read, stack = set(), [code]
    while stack:
        c = stack.pop()
        read.update(c.co_names)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    return {n: describe(names[n]) for n in sorted(read) if n in names
            and (isinstance(names[n], (bool, int, float, str)) or torch.is_tensor(names[n]))}


def _describe_cell(cell, depth: int) -> object:
    try:
        content = cell.cell_contents
    except ValueError:  # an empty cell
        return None
    if content is None or isinstance(content, (bool, int, float, str)) or torch.is_tensor(content):
        return describe(content)
    return _describe_object(content, depth + 1)


def _describe_attributes(value, depth: int) -> dict:
    out = {}
    for name, attribute in sorted(vars(value).items()):
        if name.startswith("_") or isinstance(attribute, torch.nn.Module):  # private: hooks, caches, Pyro's own
            continue
        if attribute is None or isinstance(attribute, (bool, int, float, str)) or torch.is_tensor(attribute):
            out[name] = describe(attribute)
        elif isinstance(attribute, (list, tuple, dict)) or callable(attribute) or hasattr(attribute, "__dict__"):
            out[name] = _describe_object(attribute, depth + 1) if not isinstance(attribute, (list, tuple, dict)) \
                else describe(attribute) if depth < 2 else type(attribute).__qualname__
    return out


def differences(saved: Dict[str, object], current: Dict[str, object]) -> List[str]:
    """What differs between two fingerprints, one line per setting: ``name: here ..., in the checkpoint ...``
    (only the kernel when that differs: its settings differ with it)."""
    if saved.get("kernel") != current.get("kernel"):
        return [f"kernel: {current.get('kernel')!r} here, {saved.get('kernel')!r} in the checkpoint"]
    lines = []
    for name in sorted((set(saved) | set(current)) - {"random start"}):
        if not _same(saved.get(name), current.get(name)):
            lines.append(f"{name}: {_shown(current.get(name))} here, {_shown(saved.get(name))} in the checkpoint")
    return lines


#: how :func:`describe` writes a dtype: ``str(torch.bfloat16)``, ``'torch.bfloat16'``
DTYPE_NAMES = frozenset(str(v) for v in vars(torch).values() if isinstance(v, torch.dtype))


def _same(saved: object, current: object) -> bool:
    """Whether two described values agree; a dtype that a checkpoint written before dtypes were named holds as
    ``'dtype'`` agrees with any dtype (that checkpoint's run did not tell them apart), so it still continues."""
    if saved == "dtype" and current in DTYPE_NAMES:
        return True
    if isinstance(saved, list) and isinstance(current, list):
        return len(saved) == len(current) and all(map(_same, saved, current))
    if isinstance(saved, dict) and isinstance(current, dict):
        return saved.keys() == current.keys() and all(_same(saved[k], current[k]) for k in saved)
    return saved == current


def _shown(value: object) -> str:
    """A described value in a message: a dtype as ``torch.bfloat16``, anything else as its ``repr``."""
    return value if isinstance(value, str) and value in DTYPE_NAMES else repr(value)


def run_fingerprint(kernel, *, num_chains: int, num_samples: int, warmup_steps: int, thinning: int, minibatches: str,
                    initial_params, args: tuple, kwargs: dict) -> dict:
    """What a checkpoint must share with a run to continue it: the kernel, its settings, the chains and
    lengths, the data (shapes and hashes of their bytes) and the initial point."""
    from ..kernels.base import constructor_signature

    model = kernel.model if getattr(kernel, "model", None) is not None else getattr(kernel, "potential_fn", None)
    left_out = {"model", "potential_fn", "record_draws"}  # the initial point is checked itself
    settings = {f"{type(kernel).__name__}.{name}": describe(getattr(kernel, name, None))
                for name in constructor_signature(type(kernel)).parameters if name not in left_out}
    return {"kernel": type(kernel).__name__, "model": describe(model), **settings, "num_chains": num_chains,
            "num_samples": num_samples, "warmup_steps": warmup_steps, "thinning": thinning, "minibatches": minibatches,
            **{f"args[{i}]": describe(a) for i, a in enumerate(args)},
            **{f"kwargs[{k!r}]": describe(v) for k, v in kwargs.items()}, "initial_params": describe(initial_params),
            # the random streams when the run starts (another seed): said, not refused (see Checkpointer)
            "random start": describe(torch.get_rng_state())}


__all__ = ["run_fingerprint", "describe", "differences"]
