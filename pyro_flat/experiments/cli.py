"""The ``pyro-flat`` command line (also ``python -m pyro_flat``).

One command per study of :data:`~pyro_flat.experiments.registry.STUDIES` (``pyro-flat --help``
lists them), each with the options of its config; the registry says which function runs it and
which exit code its report gives.

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
import sys
from typing import Iterator, List, Optional, TextIO

from .output import Terminated, held_signal
from .registry import STUDIES
from .study_config import add_options, config_from_args


class _Parser(argparse.ArgumentParser):
    """argparse, with a malformed option reported in one line (not the whole usage), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per study of :data:`~pyro_flat.experiments.registry.STUDIES`, with its config's options."""
    parser = _Parser(prog="pyro-flat", description="Flatness-seeking Bayesian inference with Pyro")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, study in STUDIES.items():
        add_options(sub.add_parser(name, help=study.summary, description=study.description), study.config)
    parser.commands = sub.choices  # each command's own parser, for its own error messages
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the study ``args.command`` (its module is imported only now: ``--help`` needs no torch)."""
    study = STUDIES[args.command]
    return study(config_from_args(study.config, args))


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
        return code if held is None else 128 + held  # 130 or 143, as the shell gives
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
