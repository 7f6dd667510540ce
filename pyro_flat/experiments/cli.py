"""The ``pyro-flat`` command line (also ``python -m pyro_flat``).

- ``pyro-flat mnist79``: the MNIST 7-vs-9 study (:func:`~pyro_flat.experiments.mnist79.run_mnist79`);
- ``pyro-flat synthetic2d``: chains started on the ridge of the 2-D sharp/flat energy, the share in
  each basin beside the exact one (:func:`~pyro_flat.experiments.synthetic2d.run_synthetic2d_study`);
- ``pyro-flat bnn``: every BNN family, plain and sharpness-aware, on a Bayesian MLP over seeds, with
  flatness, calibration, out-of-distribution and distribution-shift metrics (:func:`~pyro_flat.experiments.bnn.run_bnn_study`);
- ``pyro-flat paths``: the minimum-energy path between two minima of that MLP and the curvature
  along it (:func:`~pyro_flat.experiments.paths.run_path_study`).

User errors (a bad or malformed option, missing data, an ``--out`` that is a file or a folder of
other files) print one line naming the option and exit with code 2; Ctrl-C during sampling still
writes the draws made so far and exits with code 130. Each command writes a fresh folder that
replaces ``--out`` when it is done (see :mod:`pyro_flat.experiments.output`). A reader that stops
reading (``pyro-flat mnist79 ... | head -3``) costs only the rest of the printed text: the study
carries on and writes its files (:class:`_ClosedPipeGuard`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from dataclasses import fields
from typing import Iterator, List, Optional, TextIO

from .configs import BNNConfig, MNIST79Config, PathConfig, StudyConfig, Synthetic2DConfig
from .output import Terminated, held_signal


class _Parser(argparse.ArgumentParser):
    """argparse, with a malformed option reported in one line (not the whole usage), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One option per field of ``cls`` declared with :func:`~pyro_flat.experiments.configs.option`,
    with its help and default: an option is declared once, in its config."""
    defaults = cls()
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        settings = {k: v for k, v in f.metadata["cli"].items() if k not in ("flag", "default_text", "none_word")}
        flag = f.metadata["cli"].get("flag", "--" + f.name.replace("_", "-"))
        default = getattr(defaults, f.name)
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


#: each command: its config, a one-line help and a description
COMMANDS = {
    "mnist79": (MNIST79Config, "Bayesian logistic regression on MNIST sevens vs nines",
                "Sample Bayesian logistic regression on MNIST 7 vs 9 and write the draws, ArviZ summary, figures, "
                "BMA metrics and report.md to --out."),
    "synthetic2d": (Synthetic2DConfig, "which basin chains started on the ridge of a 2-D sharp/flat energy end in",
                    "Start many chains of SGD, SGLD, EntropySGLD (several η), SASGLD and FlatSGLD at the saddle "
                    "between a sharp and a flat mode; report the share in each basin beside the exact stationary "
                    "shares; write report.md, report.json and figures."),
    "bnn": (BNNConfig, "every BNN family (SGLD, BBB, SWAG, MC-dropout, ensembles), plain and sharpness-aware, on a "
                       "Bayesian MLP over seeds: flatness, calibration, OOD detection, distribution shift",
            "Train a Bayesian MLP on some MNIST digits with each BNN family of 'Flat Seeking BNNs' and its "
            "sharpness-aware version (and EntropySGLD, FlatSGLD, SA-BMA) under one gradient budget, at several seeds; "
            "write report.md, report.json, families.png, shift.png and bma_vs_models.png."),
    "paths": (PathConfig, "the minimum-energy path between two minima of a Bayesian MLP, and the curvature along it",
              "Two SGLD draws of the BNN study's MLP descend to minima of the training NLL; the straight line and "
              "the minimum-energy path (NEB) join them; write the loss, top Hessian eigenvalue and trace along both "
              "(paths.png), where each sampler's draws sit (draws.png) and SGD started on the path (dynamics.png), "
              "with report.md and report.json."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pyro-flat", description="Flatness-seeking Bayesian inference with Pyro")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command, (cls, help_text, description) in COMMANDS.items():
        add_options(sub.add_parser(command, help=help_text, description=description), cls)
    parser.commands = sub.choices  # each command's own parser, for its own error messages
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the study ``args.command`` (its module is imported only now: ``--help`` needs no torch)."""
    config = config_from_args(COMMANDS[args.command][0], args)
    config.validate()  # a bad option is one line at once, before the study imports torch
    if args.command == "mnist79":
        from .mnist79 import run_mnist79

        report = run_mnist79(config)
        if report["interrupted"]:
            return 143 if report.get("interrupted_by") == "SIGTERM" else 130
    elif args.command == "synthetic2d":
        from .synthetic2d import run_synthetic2d_study

        run_synthetic2d_study(config)
    elif args.command == "bnn":
        from .bnn import run_bnn_study

        run_bnn_study(config)
    else:
        from .paths import run_path_study

        run_path_study(config)
    return 0


def os_error_text(err: OSError, out: Optional[str] = None) -> str:
    """One line for an ``OSError``: a full disk says so and names the file that could not be written."""
    name = os.path.basename(str(err.filename)) if err.filename else None
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        where = f"writing {name}" + (f" for --out {out}" if out else "") if name else "writing the results"
        return (f"the disk is full: {where} failed ({err.strerror or err}); free some space, or pass an --out on "
                "another disk, and run again")
    return str(err)


class _ClosedPipeGuard:
    """``sys.stdout`` or ``sys.stderr`` for the length of a command: once the reader has closed the
    pipe (``BrokenPipeError``), the rest of the text goes to ``os.devnull`` (as the Python docs
    recommend for SIGPIPE) and the study carries on, so a closed pipe never costs the files."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.reader_gone = False  # the reader closed the pipe

    def _drop_the_rest(self) -> None:
        self.reader_gone = True
        try:  # the stream's descriptor now points at devnull: its buffered text and the interpreter's
            fd = self._stream.fileno()  # final flush go there, without another error
        except (AttributeError, OSError, ValueError):  # not a real file (e.g. pytest's capture)
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop_the_rest()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_the_rest()

    def __getattr__(self, name):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def _closed_pipes_dropped() -> Iterator[None]:
    """Within the block, writing to a closed stdout or stderr pipe drops the text instead of raising."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if s is None or isinstance(s, _ClosedPipeGuard) else _ClosedPipeGuard(s)
                              for s in streams)
    try:
        yield
    finally:
        for guard in (sys.stdout, sys.stderr):
            if isinstance(guard, _ClosedPipeGuard) and guard not in streams:
                guard.flush()
        sys.stdout, sys.stderr = streams


def main(argv: Optional[List[str]] = None) -> int:
    with _closed_pipes_dropped():
        return _main(argv)


def _main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the command's help, not the top level's
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        code = run_command(args)
        held = held_signal()  # a Ctrl-C or SIGTERM that waited for the files to be written
        return code if held is None else (143 if held == signal.SIGTERM else 130)
    except ValueError as err:  # StudyError, MNISTFileError and the kernels' argument checks
        print(f"pyro-flat: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # DivergenceError: the message says which step size to try
        print(f"pyro-flat: error: {err} On the command line: --step-size.", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. the disk filled up while writing: --out is left as it was
        print(f"pyro-flat: error: {os_error_text(err, getattr(args, 'out', None))}; --out left as it was",
              file=sys.stderr)
        return 1
    except Terminated:
        print("pyro-flat: terminated (SIGTERM); --out left as it was", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("pyro-flat: interrupted; --out left as it was", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
