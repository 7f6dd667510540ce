"""Convergence of Entropy-MCMC and its baselines on MNIST 7 vs 9, in 2-Wasserstein distance.

Bayesian logistic regression (784 pixels + intercept, the embedded 800 training images, prior
precision 4), minibatch 100, eta = 0.01. Two parts, one run:

1. **The many-chain W2 check** (issue 4's performance target): ``check_convergence`` with 256
   EntropySGLD chains x 2,000 iterations against its Theorem-1 bound; target under 300 s on 2 CPU
   cores. Baseline in the same run: the same chains one at a time (one chain's speed, measured on
   a shorter run, times the chain count).
2. **The study**: EntropySGLD (Entropy-MCMC), SGLD, LocalEntropySGLD, SGD and LocalEntropySGD
   with the same step size (0.9 x the admissible step of the Entropy-MCMC joint) and the same
   budget of gradient evaluations per chain; LocalEntropySGLD once more with its own admissible
   outer step. At each checkpoint: W2 of the ensemble to the posterior and to the flat posterior
   (marginal estimator; references from one EntropyHMC run), and the test accuracy of the
   ensemble's Bayesian model average. A table, ``convergence.png``, ``bound.png`` and
   ``convergence.json`` go to ``--out``.

Run:  python benchmarks/bench_convergence.py [--chains 256] [--grad-evals 2000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from pyro_flat import SGD, SGLD, EntropySGLD, LocalEntropySGD, LocalEntropySGLD, check_convergence  # noqa: E402
from pyro_flat.convergence import run_ensemble  # noqa: E402
from pyro_flat.theory import (  # noqa: E402
    W2Estimator,
    admissible_step_size,
    joint_constants,
    local_entropy_constants,
)
from pyro_flat.convergence.references import reference_draws  # noqa: E402
from pyro_flat.theory.problems import LogisticRegressionProblem  # noqa: E402

BUDGET_S = 300.0


def many_chain_check(problem, eta, step, args):
    t0 = time.perf_counter()
    result = check_convergence(problem, "entropy_sgld", eta=eta, step_size=step, batch_size=args.batch_size,
                               num_chains=args.chains, num_iterations=args.check_iterations,
                               progress_bar=False, num_bootstrap=20)
    wall = time.perf_counter() - t0
    # baseline: one chain at a time (the same kernel, one chain), extrapolated to all chains
    iters = max(args.check_iterations // 10, 50)
    kernel = EntropySGLD(potential_fn=problem.potential_fn(args.batch_size), eta=eta, step_size=step)
    t1 = time.perf_counter()
    run_ensemble(kernel, problem.initial_point(), 1, [iters], progress_bar=False)
    one_chain = (time.perf_counter() - t1) / iters
    sequential = one_chain * args.chains * args.check_iterations
    return result, wall, sequential


def samplers(problem, eta, step, args):
    m, M = problem.constants()
    m_F, M_F = local_entropy_constants(m, M, eta)
    own = 0.9 * admissible_step_size(m_F, M_F)
    L = args.inner_steps
    local = dict(eta=eta, num_inner_steps=L, inner_step_size=step)
    return [
        ("EntropySGLD", lambda fn: EntropySGLD(potential_fn=fn, eta=eta, step_size=step)),
        ("SGLD", lambda fn: SGLD(potential_fn=fn, step_size=step)),
        ("SGD", lambda fn: SGD(potential_fn=fn, step_size=step)),
        (f"LocalEntropySGLD (L={L})", lambda fn: LocalEntropySGLD(potential_fn=fn, step_size=step, **local)),
        (f"LocalEntropySGD (L={L})", lambda fn: LocalEntropySGD(potential_fn=fn, step_size=step, **local)),
        (f"LocalEntropySGLD (L={L}, own step {own:.2g})",
         lambda fn: LocalEntropySGLD(potential_fn=fn, step_size=own, **local)),
    ]


def study(problem, eta, step, args, w2_post, w2_flat):
    rows = {}
    for name, make in samplers(problem, eta, step, args):
        kernel = make(problem.potential_fn(args.batch_size))
        per_iter = kernel.grads_per_iteration
        iterations = args.grad_evals // per_iter
        checkpoints = np.unique(np.linspace(0, iterations, args.checkpoints).round().astype(int))
        t0 = time.perf_counter()
        states = run_ensemble(kernel, problem.initial_point(), args.chains, checkpoints, progress_bar=False)
        seconds = time.perf_counter() - t0
        rec = {"iterations": checkpoints.tolist(), "grad_evals": (checkpoints * per_iter).tolist(),
               "seconds": seconds, "w2_posterior": [], "w2_posterior_se": [], "w2_flat": [],
               "w2_flat_se": [], "bma_accuracy": [], "chain_accuracy": []}
        for k in checkpoints:
            theta = states[k]["theta"].double().numpy()
            flat = states[k]["theta_aux" if "theta_aux" in states[k] else "theta"].double().numpy()  # θa if any
            for key, est in (("w2_posterior", w2_post(theta)), ("w2_flat", w2_flat(flat))):
                rec[key].append(est.value)
                rec[key + "_se"].append(est.stderr)
            bma, single = problem.accuracy(theta)
            rec["bma_accuracy"].append(bma)
            rec["chain_accuracy"].append(single)
        rows[name] = rec
        print(f"  {name:40s} {seconds:6.1f} s sampling, W2 post {rec['w2_posterior'][-1]:7.3f}, "
              f"W2 flat {rec['w2_flat'][-1]:7.3f}, BMA acc {rec['bma_accuracy'][-1]:.3f}", flush=True)
    return rows


def figure(rows, floors, out: Path):
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for row, xkey in enumerate(("iterations", "grad_evals")):
        for col, (key, title) in enumerate((("w2_posterior", "W2 to the posterior (θ)"),
                                            ("w2_flat", "W2 to the flat posterior (θa / local entropy)"),
                                            ("bma_accuracy", "test accuracy, BMA over chains"))):
            ax = axes[row, col]
            for name, rec in rows.items():
                ax.plot(rec[xkey], rec[key], marker="o", ms=2.5, label=name)
            if key in floors:
                ax.axhline(floors[key], color="gray", ls=":", label="estimator floor")
            if key != "bma_accuracy":
                ax.set_yscale("log")
            else:
                ax.set_ylim(0.5, 1.0)
            ax.set_xlabel("iteration" if xkey == "iterations" else "gradient evaluations per chain")
            ax.set_title(title, fontsize=10)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("MNIST 7 vs 9 logistic regression: same step size, same gradient budget")
    fig.tight_layout()
    fig.savefig(out / "convergence.png", dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=256)
    parser.add_argument("--check-iterations", type=int, default=2000)
    parser.add_argument("--grad-evals", type=int, default=2000)
    parser.add_argument("--inner-steps", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=21)
    parser.add_argument("--eta", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-check", action="store_true", help="only the study")
    parser.add_argument("--out", default="pyro-flat-out/convergence")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    problem = LogisticRegressionProblem.mnist79()
    m, M = problem.constants()
    m_J, M_J = joint_constants(m, M, args.eta)
    step = 0.9 * admissible_step_size(m_J, M_J)
    print(f"MNIST 7 vs 9: n={len(problem.X)}, d={problem.dim}, m={m:.3g}, M={M:.4g}, "
          f"joint m_J={m_J:.3g}, M_J={M_J:.4g}; step {step:.3g} (0.9 x 2/(m_J+M_J)); "
          f"minibatch noise bound {problem.gradient_noise(args.batch_size):.4g}")
    t0 = time.perf_counter()
    reference_draws(problem, args.eta)
    t_ref = time.perf_counter() - t0
    print(f"reference: EntropyHMC, 4 chains x 1000 draws, {t_ref:.1f} s")
    report = {"settings": vars(args), "constants": {"m": m, "M": M, "m_J": m_J, "M_J": M_J, "step": step},
              "reference_seconds": t_ref}

    if not args.skip_check:
        result, wall, sequential = many_chain_check(problem, args.eta, step, args)
        print(f"\n1. check_convergence(EntropySGLD, {args.chains} chains x {args.check_iterations} iterations)")
        print("   " + str(result).replace("\n", "\n   "))
        print(f"   wall {wall:.1f} s (sampling {result.wall_time['sampling']:.1f} s, W2 estimates "
              f"{result.wall_time['estimation']:.1f} s); budget {BUDGET_S:.0f} s: ratio {wall / BUDGET_S:.2f} "
              f"{'ok' if wall < BUDGET_S else 'MISSED'}")
        print(f"   baseline, the same chains one at a time: {sequential:.0f} s (extrapolated); "
              f"speed-up of the vectorized sampling {sequential / result.wall_time['sampling']:.1f}x")
        result.plot().savefig(out / "bound.png", dpi=120)
        report["check"] = {"wall": wall, "sequential_extrapolated": sequential, "passed": result.passed,
                           "w2": result.w2.tolist(), "bound": None if result.bound is None else result.bound.tolist(),
                           "floor": result.w2_floor, "iterations": result.iterations.tolist(),
                           "bound_terms": result.bound_terms}

    print(f"\n2. study: {args.chains} chains, {args.grad_evals} gradient evaluations per chain, step {step:.3g}")
    w2_post = W2Estimator(problem.reference("posterior", args.eta), method="marginal", num_bootstrap=20)
    w2_flat = W2Estimator(problem.reference("flat", args.eta), method="marginal", num_bootstrap=20)
    rows = study(problem, args.eta, step, args, w2_post, w2_flat)
    floors = {"w2_posterior": w2_post.floor_for(args.chains), "w2_flat": w2_flat.floor_for(args.chains)}
    map_acc = problem.accuracy(torch.as_tensor(problem.mode())[None])[0]
    print("\n| sampler | grad evals | iterations | W2 posterior | W2 flat | BMA acc. | chain acc. | time |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rec in rows.items():
        for i in (len(rec["iterations"]) // 2, -1):
            print(f"| {name} | {rec['grad_evals'][i]} | {rec['iterations'][i]} | "
                  f"{rec['w2_posterior'][i]:.3f} ± {rec['w2_posterior_se'][i]:.3f} | "
                  f"{rec['w2_flat'][i]:.3f} ± {rec['w2_flat_se'][i]:.3f} | {rec['bma_accuracy'][i]:.3f} | "
                  f"{rec['chain_accuracy'][i]:.3f} | {rec['seconds']:.1f} s |")
    print(f"estimator floors ({args.chains} exact draws): posterior {floors['w2_posterior']:.3f}, "
          f"flat {floors['w2_flat']:.3f}; MAP test accuracy {map_acc:.3f}")
    figure(rows, floors, out)
    report.update({"study": rows, "floors": floors, "map_accuracy": map_acc})
    (out / "convergence.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'convergence.png'}, {out / 'bound.png'}, {out / 'convergence.json'}")


if __name__ == "__main__":
    main()
