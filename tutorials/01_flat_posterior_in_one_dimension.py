"""Tutorial 1: the flat posterior of a sharp-plus-wide mixture, in one dimension.

The target has a sharp mode at -1.5 (sd 0.2) and a wide one at +1.5 (sd 1), with equal mass. The
flat posterior is the target convolved with N(0, η): the sharp peak is smeared away as η grows,
the wide one barely changes. EntropySGLD samples both at once: its θ draws follow the target, its θa
draws the flat posterior. The figure compares the histograms with the closed-form densities.

Run:  python tutorials/01_flat_posterior_in_one_dimension.py   (PYRO_FLAT_REDUCED=1 for a quick run)
Writes tutorials/out/flat_posterior_1d.png
"""

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

import pyro
import pyro.distributions as dist
from pyro.infer import MCMC
import pyro_flat

REDUCED = os.environ.get("PYRO_FLAT_REDUCED") == "1"
NUM_SAMPLES = 3_000 if REDUCED else 40_000
LOCS, SCALES = torch.tensor([-1.5, 1.5]), torch.tensor([0.2, 1.0])
MIXTURE = dist.MixtureSameFamily(dist.Categorical(torch.tensor([0.5, 0.5])), dist.Normal(LOCS, SCALES))


def model():
    pyro.sample("theta", MIXTURE)


def flat_density(x: torch.Tensor, eta: float) -> torch.Tensor:
    """p * N(0, η): each component's variance grows by η."""
    smoothed = dist.MixtureSameFamily(
        dist.Categorical(torch.tensor([0.5, 0.5])), dist.Normal(LOCS, (SCALES**2 + eta).sqrt())
    )
    return smoothed.log_prob(x).exp()


def main():
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    # 1. The flat posterior is an ordinary Pyro model: "theta" gains a twin "theta_aux".
    flat_model = pyro_flat.flat_posterior(model, eta=0.5)
    trace = pyro.poutine.trace(flat_model).get_trace()
    print("sites of the flat model:", [n for n, s in trace.nodes.items() if s["type"] == "sample"])

    # 2. Sample it with EntropySGLD inside Pyro's MCMC, for two values of η.
    grid = torch.linspace(-5, 6, 400)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, eta in zip(axes, [0.05, 0.5]):
        kernel = pyro_flat.EntropySGLD(model, eta=eta, step_size=5e-3)
        mcmc = MCMC(kernel, num_samples=NUM_SAMPLES, warmup_steps=500, disable_progbar=REDUCED)
        mcmc.run()
        s = mcmc.get_samples()
        ax.hist(s["theta"].numpy(), bins=120, range=(-5, 6), density=True, alpha=0.45,
                color="C0", label="θ draws")
        ax.hist(s["theta_aux"].numpy(), bins=120, range=(-5, 6), density=True, alpha=0.45,
                color="C1", label="θa draws")
        ax.plot(grid, MIXTURE.log_prob(grid).exp(), "C0", lw=1.5, label="p(θ | D)")
        ax.plot(grid, flat_density(grid, eta), "C1", lw=1.5, label="flat: p(θ | D) * N(0, η)")
        ax.set_title(f"η = {eta}")
        ax.set_xlabel("θ")
        summary = pyro_flat.to_arviz(mcmc).sample_stats["coupling_distance"].values
        print(f"eta={eta}: mean |θ-θa| = {summary.mean():.3f}  (E|N(0, η)| = {(2 * eta / torch.pi) ** 0.5:.3f})")
    axes[0].set_ylabel("density")
    axes[1].legend(loc="upper left", fontsize=8)
    fig.suptitle("Entropy-MCMC on a sharp (left) + wide (right) mixture: θa smooths the sharp mode away")
    fig.tight_layout()
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    fig.savefig(out / "flat_posterior_1d.png", dpi=100)
    print(f"wrote {out / 'flat_posterior_1d.png'}")


if __name__ == "__main__":
    main()
