"""plot_fit on a log axis and over a chosen time window (issue 23).

The model is a concentration that starts at 0: `dy/dt = k (1 - y)`, `y(0) = 0`, measured
from t = 0.5 on. On a log axis its dense curve reaches down to ~0 at t0; the panel's y-range
must come from the data instead.
"""

import diffrax
import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels as hk

matplotlib = pytest.importorskip("matplotlib", reason="the `plot` extra is not installed")
matplotlib.use("Agg")


class Rate(eqx.Module):
    k: jnp.ndarray


def rise_simulate(predictors, ts, covariates, y0, solver):
    (rate,) = predictors
    term = diffrax.ODETerm(lambda t, y, args: rate.k * (1.0 - y))
    return solver.diffeqsolve(term, ts, y0).ys


def identity(full):
    return full


@pytest.fixture(scope="module")
def setup():
    ts = np.array([0.5, 1.0, 2.0, 4.0])
    experiment = hk.make_experiment(
        covariates={},
        channels={"C": hk.ChannelObs(ts, 1.0 - np.exp(-ts), 0.01)},
        y0_fn=lambda c, ch: jnp.zeros(1),
        exp_id="s1",
        t0=0.0,
    )
    dataset = hk.make_dataset([experiment], output_channel_names=["C"])
    solver = hk.SolverConfig(solver=diffrax.Tsit5(), rtol=1e-8, atol=1e-10, max_steps=256, dt0=None)
    kwargs = dict(simulate_fn=rise_simulate, state_to_output=identity, solver=solver)
    return (Rate(jnp.asarray(1.0)),), dataset, kwargs


def test_log_y_sets_a_log_axis_whose_range_starts_from_the_data(setup):
    predictors, dataset, kwargs = setup
    fig = hk.plot_fit(predictors, dataset, log_y=True, n_points=40, **kwargs)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    smallest_measured = 1.0 - np.exp(-0.5)
    assert low == pytest.approx(smallest_measured / 10)
    assert high == pytest.approx(1.5 * (1.0 - np.exp(-4.0)), rel=1e-6)


def test_log_y_leaves_out_non_positive_values_of_the_curve(setup):
    predictors, dataset, kwargs = setup
    fig = hk.plot_fit(predictors, dataset, log_y=True, n_points=40, **kwargs)
    _, curve = fig.axes[0].get_lines()
    y = np.asarray(curve.get_ydata(), dtype=float)
    assert np.isnan(y[0])  # the curve's value 0 at t0 is not drawn
    assert np.all(y[1:] > 0)


def test_t_range_sets_the_time_window_and_the_y_range_follows_it(setup):
    predictors, dataset, kwargs = setup
    fig = hk.plot_fit(predictors, dataset, t_range=(1.0, 4.0), n_points=40, **kwargs)
    ax = fig.axes[0]
    assert ax.get_xlim() == pytest.approx((1.0, 4.0))
    assert ax.get_ylim()[0] > 1.0 - np.exp(-1.0) - 0.1  # not stretched down to 0 at t0


def test_the_default_axis_stays_linear(setup):
    predictors, dataset, kwargs = setup
    fig = hk.plot_fit(predictors, dataset, n_points=40, **kwargs)
    assert fig.axes[0].get_yscale() == "linear"


@pytest.mark.parametrize("t_range", [(2.0, 1.0), (0.0, np.inf)])
def test_a_bad_t_range_is_refused(setup, t_range):
    predictors, dataset, kwargs = setup
    with pytest.raises(ValueError, match="plot_fit: `t_range` must be two finite times"):
        hk.plot_fit(predictors, dataset, t_range=t_range, **kwargs)


def test_a_log_plot_is_written_as_a_png(setup, tmp_path):
    predictors, dataset, kwargs = setup
    fig = hk.plot_fit(predictors, dataset, log_y=True, **kwargs)
    path = tmp_path / "fit_log.png"
    fig.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
