"""The frame of every study's settings: :class:`StudyConfig`, and :func:`option`, a config field that
is also a command-line option, with its way into ``argparse`` (:func:`add_options`) and back
(:func:`config_from_args`): an option is declared once, in its config.

Each study's own config is in :mod:`~pyro_flat.experiments.configs`, the studies themselves in
:mod:`~pyro_flat.experiments.registry`. This module imports neither torch nor Pyro, so
``pyro-flat --help`` answers at once.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_options(parser, StudyConfig)
>>> config_from_args(StudyConfig, parser.parse_args(["--seed", "3", "--no-progress"]))
StudyConfig(seed=3, overwrite=False, progress=False, threads=None)
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Dict, Optional, Tuple

from .output import require_int, require_positive, require_seed


def option(default: Any, help: str, **settings) -> Any:
    """A config field that is also an option of its command (declared once, here).

    ``help`` gets `` (default X)`` appended (``default_text`` replaces X; ``""`` shows none). The
    flag is ``--`` and the field's name with dashes unless ``flag`` says otherwise; the other
    ``settings`` go to ``argparse`` (``type`` is the default's for numbers, ``nargs="+"`` for a
    tuple). ``none_word=True``: the word ``none`` means ``None``.
    """
    return field(default=default, metadata={"help": help, "cli": settings})


def out_option(default: str) -> Any:
    return option(default, "output directory; it is replaced at the end of the run if it holds an earlier run of "
                           "this command")


def threads_option(default: Optional[int]) -> Any:
    return option(default, "torch threads during the run; on a busy machine 1 is fastest", type=int,
                  default_text=default or "one per core, or 1 on a busy machine")


@dataclass
class StudyConfig:
    """What every study's settings share. Subclasses set :attr:`COMMAND`, their own ``out`` default
    and :attr:`REDUCED`, the overrides of their small run.

    ``threads`` is torch's thread count during the run (restored after). ``synthetic2d``'s small model runs
    on one thread (as fast as two), and so do ``images``, ``images-eta`` and ``transfer``. ``mnist79``,
    ``bnn`` and ``paths`` default to ``None``: torch's own count (one per core), or one thread when the
    machine is busy
    (:func:`~pyro_flat.experiments.output.auto_threads`, said in a line). Measured on 2 cores: all
    cores are faster idle (the earlier ``paths`` study took 2 min 20 s on 2 threads, 4 min 50 s on one), but with 3
    busy processes beside it 1,000 gradient evaluations of the ``bnn`` study's EntropySGLD took 80 s
    on 2 threads (9 s idle), 24 s on 2 threads with ``OMP_WAIT_POLICY=PASSIVE`` and 11 s on one
    thread: waiting OpenMP threads spin, and a step of many small operations pays a time slice at
    each.
    """

    COMMAND: ClassVar[str] = ""
    REDUCED: ClassVar[Dict[str, object]] = {}

    seed: int = option(0, "random seed of every sampler; one seed gives the same run again")
    overwrite: bool = option(False, "replace --out even if it holds other files, and discard the checkpoints an "
                                    "unfinished run left beside it (--resume continues that run instead)",
                             action="store_true",
                             default_text="")
    progress: bool = option(True, "no progress bars", flag="--no-progress", action="store_false", default_text="")
    threads: Optional[int] = threads_option(None)

    @classmethod
    def reduced(cls, **overrides):
        """The small run of the tests and of the tutorials' reduced mode (``overrides`` on top)."""
        return cls(**{**cls.REDUCED, **overrides})

    @classmethod
    def field_names(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def require_positive(self, *names: str) -> None:
        """Each field of ``names`` finite and > 0, or a ``StudyError`` naming its option (``--step-size``)."""
        for name in names:
            require_positive(f"--{name.replace('_', '-')}", getattr(self, name))

    def require_int(self, minimum: int, *names: str) -> None:
        """Each field of ``names`` an integer ``>= minimum``, or a ``StudyError`` naming its option."""
        for name in names:
            require_int(f"--{name.replace('_', '-')}", getattr(self, name), minimum)

    def validate(self) -> None:
        """A :class:`~pyro_flat.experiments.output.StudyError` naming the option of a bad value."""
        require_seed(self.seed)
        if self.threads is not None:
            self.require_int(1, "threads")


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of ``cls`` declared with :func:`option`, with its help and default."""
    defaults = cls()
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        settings = {k: v for k, v in f.metadata["cli"].items() if k not in ("flag", "default_text", "none_word")}
        flag = f.metadata["cli"].get("flag", "--" + f.name.replace("_", "-"))
        # the declared default (a __post_init__ may resolve None by other fields, e.g. bnn's --rho by --network)
        default = f.default if f.default is not MISSING else getattr(defaults, f.name)
        shown = f.metadata["cli"].get("default_text", default)
        if isinstance(default, tuple):
            settings.setdefault("nargs", "+")
            shown = " ".join(map(str, default)) if shown is default else shown
            sample, default = (default[0] if default else None), list(default)
        else:
            sample = default
        if "action" not in settings and "type" not in settings and isinstance(sample, (int, float)):
            settings["type"] = type(sample)
        help_text = f.metadata["help"] + ("" if shown == "" else f" (default {shown})")
        parser.add_argument(flag, dest=f.name, default=default, help=help_text, **settings)


def config_from_args(cls, args: argparse.Namespace) -> StudyConfig:
    """The ``cls`` config of the parsed ``args``: every option of ``cls`` (lists become tuples, the
    word ``none`` of an optional one becomes ``None``)."""
    values = {}
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        value = getattr(args, f.name)
        if isinstance(value, list):
            value = tuple(value)
        if f.metadata["cli"].get("none_word") and str(value).lower() == "none":
            value = None
        values[f.name] = value
    return cls(**values)
