"""Population pharmacokinetics from a NONMEM-style table: learn a saturable elimination.

Two compartments: the central amount A1 [mg] (volume V [L], concentration C = A1 / V) and a
peripheral amount A2. Doses are boluses into the central compartment and one-hour infusions
(some overlapping, some back to back) at subject-specific times:

    dA1/dt = rate1(t) - V h(C) - K12 A1 + K21 A2
    dA2/dt = K12 A1 - K21 A2

The elimination h(C) [mg/L/h] is unknown (the truth is Michaelis-Menten,
VMAX C / (KM + C)) and is learned twice: by a small MLP and by a confluent bank that grows
itself from two atoms (`TransitionHook.growing` on the training loss, up to 8 atoms). The
volume grows with body weight (`WT`, a covariate column of the table): V = 10 WT / 70.

The data are `data/population_pk.csv`, in NONMEM's record format
(`ID, TIME, DV, AMT, RATE, EVID, MDV, CMT, WT`; `DV=0` on the dose rows, as many datasets
have it), read by `hk.experiments_from_nonmem`. Three subjects are held out; their
predictions are written as a table with `IPRED` and `IRES` columns, with plots.

Run: `python examples/population_pk.py` (a few minutes on a 2-core CPU; `--steps 20` for a
smoke run). It writes `population_pk_elimination.png`, `population_pk_fit.png` and
`population_pk_heldout.csv` to `--out` (default: the current directory).
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import confluent_bank as cb
import hybrid_kernels as hk

jax.config.update("jax_enable_x64", True)

HERE = pathlib.Path(__file__).parent / "data"
VMAX, KM, K12, K21 = 2.0, 1.5, 0.4, 0.2
N_SUBJECTS = 12
HELD_OUT = [10, 11, 12]  # integer ids, as in the table
SAMPLES = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0]
BANK_SCALE = 1.0


def true_elimination(c: Any) -> Any:
    """The elimination the models must learn [mg/L/h]."""
    return VMAX * c / (KM + c)


class _MichaelisMenten(eqx.Module):
    """The true elimination as a predictor, so the data come from the same vectorised solve."""

    def __call__(self, c):
        return true_elimination(c)


# --8<-- [start:simulate]
def y0_fn(covariates, channels):
    """No drug before the first dose; the volume rides along as a constant third state."""
    return jnp.stack([0.0, 0.0, 10.0 * covariates["WT"] / 70.0])


def simulate(predictors, ts, covariates, y0, solver):
    """`simulate_fn`: infusions are `covariates["rate1"]`; boluses are applied by the solve."""
    (elimination,) = predictors
    h = elimination_of(elimination)

    def vf(t, a, args):
        a1, a2, v = a[0], a[1], a[2]
        c = jnp.maximum(a1 / v, 0.0)
        da1 = covariates["rate1"](t) - v * h(c) - K12 * a1 + K21 * a2
        return jnp.stack([da1, K12 * a1 - K21 * a2, jnp.zeros_like(v)])

    return solver.diffeqsolve(diffrax.ODETerm(vf), ts, y0).ys


def observe(states):
    """The concentration C = A1 / V is measured: `[T, 3] -> [T, 1]`."""
    return states[:, :1] / states[:, 2:3]


# --8<-- [end:simulate]


def read(table: Any) -> list[hk.Experiment]:
    """Experiments from the record table: DV is C, doses go into CMT 1 (state 0)."""
    return hk.experiments_from_nonmem(
        table, y0_fn=y0_fn, cmt_to_state={1: 0}, channel="C", covariates=("WT",)
    )


# --- the clinic's data ------------------------------------------------------------------------


def _dosing(rng: np.random.Generator) -> list[tuple[float, float, float]]:
    """`(time, amount, rate)` per dose: a bolus and 2-3 one-hour infusions."""
    doses = [(0.0, round(float(rng.uniform(20.0, 40.0)), 1), 0.0)]
    start = float(rng.choice([1.0, 2.0, 3.0]))
    for _ in range(int(rng.integers(2, 4))):
        amt = round(float(rng.uniform(10.0, 30.0)), 1)
        doses.append((start, amt, amt))  # one hour each
        start += float(rng.choice([0.5, 1.0, 4.0]))  # overlapping, back to back or apart
    doses.append(
        (float(rng.choice([6.0, 8.0, 12.0])), round(float(rng.uniform(10.0, 30.0)), 1), 0.0)
    )
    return doses


def generate(seed: int = 0) -> None:
    """Write `population_pk.csv`: the true model, sampled and dosed the way a clinic does."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []  # DV is filled below; dose rows keep DV=0
    for subject in range(1, N_SUBJECTS + 1):
        wt = float(np.round(rng.uniform(50.0, 100.0), 1))
        events = [(t, 0, amt, rate) for t, amt, rate in _dosing(rng)]
        events += [(t, 1, 0.0, 0.0) for t in SAMPLES]
        for t, is_obs, amt, rate in sorted(events, key=lambda e: (e[0], e[1])):
            rows.append((subject, t, 0.0, amt, rate, 0 if is_obs else 1, 0 if is_obs else 1, 1, wt))
    cols = ["ID", "TIME", "DV", "AMT", "RATE", "EVID", "MDV", "CMT", "WT"]
    table = pd.DataFrame(rows, columns=cols)
    data = hk.make_dataset(read(table), output_channel_names=["C"], max_shapes=1)
    exact = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-10, atol=1e-10, max_steps=8192, dt0=None)
    truth = hk.predictions_table(
        data, hk.predict_dataset((_MichaelisMenten(),), data, simulate, observe, exact)
    )
    dv = truth.set_index(["experiment", "time"])["prediction"]
    noise = 1.0 + 0.02 * rng.standard_normal(len(table))  # 2 % proportional error
    obs = table.EVID == 0
    table.loc[obs, "DV"] = [
        round(float(dv[(str(i), t)]) * e, 5)
        for i, t, e in zip(table.ID[obs], table.TIME[obs], noise[obs], strict=True)
    ]
    HERE.mkdir(exist_ok=True)
    table.to_csv(HERE / "population_pk.csv", index=False)


# --8<-- [start:load]
def load() -> tuple[hk.Dataset, hk.Dataset]:
    """`(train, held_out)` from the CSV file."""
    experiments = read(HERE / "population_pk.csv")
    data = hk.make_dataset(experiments, output_channel_names=["C"], dtype="float64")
    return hk.split_dataset_by_ids(data, HELD_OUT)  # integer ids match "10", "11", "12"


# --8<-- [end:load]


# --- the two models ---------------------------------------------------------------------------


class MLPElimination(eqx.Module):
    """h(C) = C softplus(MLP(C / 5)): zero at C = 0 and positive."""

    mlp: eqx.nn.MLP

    def __call__(self, c):
        return c * jax.nn.softplus(self.mlp(jnp.reshape(c / 5.0, (1,)))[0])


def mlp_elimination(key: Any) -> MLPElimination:
    mlp = eqx.nn.MLP(1, 1, 16, 2, activation=jnp.tanh, key=key)
    return MLPElimination(jax.tree.map(lambda x: x * 0.5 if eqx.is_inexact_array(x) else x, mlp))


# --8<-- [start:grow]
def bank_elimination() -> cb.ConfluentPackBank:
    """Two sigmoid atoms (of h / C) in 8 slots: the growing hook places the rest. It grows by
    births and moment merges, so it holds no centred pair (`max_pairs=0`: its kernels compile
    no pair code)."""
    packs = [cb.RefinedPack(0, c, 0.05, BANK_SCALE) for c in (1.0, 3.0)]
    return cb.init_confluent_bank(packs, max_packs=8, max_order=3, dtype=jnp.float64, max_pairs=0)


def growing_hook(train: hk.Dataset, mask: Any) -> cb.TransitionHook:
    """Births, merges and removals by the library's policy, judged on the training loss; the
    candidates span the concentrations from 0 (before the first dose) to the largest measured."""
    objective = hk.build_objective(
        train, simulate_fn=simulate, state_to_output=observe, solver=SOLVER, trainable=mask
    )
    return cb.TransitionHook.growing(objective, (0.0, observed_range(train)[1]))


# --8<-- [end:grow]


def elimination_of(predictor: Any):
    """h(C) of either model; the bank learns h(C) / C, so that h(0) = 0 as for the MLP."""
    if isinstance(predictor, cb.ConfluentPackBank):
        return lambda c: c * predictor.forward(c)
    return predictor


def trainable(predictors):
    mask = hk.trainable_mask(predictors)
    if isinstance(predictors[0], cb.ConfluentPackBank):
        mask = hk.freeze_paths(mask, ["0.scales"])
    return mask


SOLVER = hk.SolverConfig(diffrax.Tsit5(), rtol=1e-7, atol=1e-7, max_steps=4096, dt0=None)


def fit(start: Any, train: hk.Dataset, steps: int, lr: float) -> tuple[Any, float]:
    config = hk.OptaxTrainingConfig(steps=(steps,), lr=(lr,), verbose=False)
    mask = trainable((start,))
    grows = isinstance(start, cb.ConfluentPackBank)
    history, trained = hk.train_with_optax(
        (start,),
        train,
        config,
        simulate_fn=simulate,
        state_to_output=observe,
        solver=SOLVER,
        trainable=mask,
        key=jax.random.key(0),
        hooks=growing_hook(train, mask) if grows else None,
    )
    return trained[0], float(history[-1])


def predictions(model: Any, held: hk.Dataset, name: str) -> Any:
    """The held-out predictions in NONMEM's words: `IPRED` and `IRES = DV - IPRED`."""
    table = hk.predictions_table(
        held, hk.predict_dataset((model,), held, simulate, observe, SOLVER)
    )
    return table.rename(
        columns={"experiment": "ID", "time": "TIME", "value": "DV", "prediction": "IPRED"}
    ).assign(IRES=lambda d: d.DV - d.IPRED, model=name)[
        ["model", "ID", "TIME", "DV", "IPRED", "IRES"]
    ]


def observed_range(data: hk.Dataset) -> tuple[float, float]:
    """The smallest and largest measured concentration: where the data say anything."""
    c = [np.asarray(bp.y_observed)[np.asarray(bp.mask)] for bp in data.bucket_payloads]
    c = np.concatenate(c)
    return float(c.min()), float(c.max())


def plot_elimination(models: dict[str, Any], c_range: tuple[float, float], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = jnp.linspace(0.0, c_range[1], 200)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(c, true_elimination(c), "k-", lw=2, label="truth (Michaelis-Menten)")
    for (name, model), style in zip(models.items(), ["C0--", "C1-."], strict=True):
        ax.plot(c, jax.vmap(elimination_of(model))(c), style, lw=2, label=name)
    ax.set_xlabel("concentration C [mg/L] (up to the largest measured)")
    ax.set_ylabel("elimination h(C) [mg/L/h]")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(steps: int = 400, out: str | pathlib.Path = ".", verbose: bool = True) -> dict:
    """Train both models, predict the held-out subjects, write the plots and the table."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train, held = load()
    models, tables, losses, errors = {}, [], {}, {}
    for name, start in (("MLP", mlp_elimination(jax.random.key(1))), ("bank", bank_elimination())):
        models[name], losses[name] = fit(start, train, steps, 0.02)
        tables.append(predictions(models[name], held, name))
        c = jnp.linspace(0.0, observed_range(train)[1], 200)
        h = jax.vmap(elimination_of(models[name]))(c)
        errors[name] = float(jnp.max(jnp.abs(h - true_elimination(c))))
        if verbose:
            rmse = float(np.sqrt((tables[-1].IRES ** 2).mean()))
            print(
                f"{name}: final loss {losses[name]:.4g}, held-out RMSE {rmse:.4g} mg/L, "
                f"max |h - truth| over the measured range {errors[name]:.3g} mg/L/h"
            )
    table = pd.concat(tables, ignore_index=True)
    table.to_csv(out / "population_pk_heldout.csv", index=False, float_format="%.5g")
    plot_elimination(models, observed_range(train), out / "population_pk_elimination.png")
    fig = hk.plot_fit(
        (models["MLP"],),
        held,
        simulate_fn=simulate,
        state_to_output=observe,
        solver=SOLVER,
        log_y=True,  # concentrations span decades; the curve starts at 0 before the first dose
        n_points=400,
    )
    fig.savefig(out / "population_pk_fit.png", dpi=120)
    return {"table": table, "losses": losses, "h_max_abs_err": errors}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default=".")
    parser.add_argument("--generate", action="store_true", help="rewrite the CSV file first")
    args = parser.parse_args()
    if args.generate or not (HERE / "population_pk.csv").exists():
        generate()
    main(steps=args.steps, out=args.out)
