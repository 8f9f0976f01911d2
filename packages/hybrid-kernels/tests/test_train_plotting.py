"""plot_history and plot_fit (matplotlib is the optional `plot` extra)."""

import numpy as np
import pytest
from helpers import omega_start, osc_dataset, quiet, train

import hybrid_kernels as hk

matplotlib = pytest.importorskip("matplotlib", reason="the `plot` extra is not installed")
matplotlib.use("Agg")


@pytest.fixture(scope="module")
def data(oscillator):
    return osc_dataset(oscillator, noise=0.02, seed=2)


@pytest.fixture(scope="module")
def run(oscillator, data):
    config = quiet(steps=(6, 6), lr=(0.05, 0.02), val_every=4)
    return train(oscillator, data, config, val_dataset=data)


def test_plot_history_draws_loss_validation_and_best(run):
    history, _ = run
    ax = hk.plot_history(history)
    labels = [line.get_label() for line in ax.get_lines()]
    assert {"training loss", "validation", "best step"} <= set(labels)
    np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), np.asarray(history))
    assert ax.get_yscale() == "log"


def test_plot_history_accepts_a_plain_list_and_an_axes():
    import matplotlib.pyplot as plt

    _, ax = plt.subplots()
    assert hk.plot_history([3.0, 2.0, 1.0], ax=ax, log=False) is ax
    assert ax.get_yscale() == "linear"


def test_plot_history_marks_skipped_steps():
    history = hk.LossHistory([1.0, float("nan"), 0.5])
    history.bad_steps = [1]
    ax = hk.plot_history(history)
    assert "skipped (non-finite)" in [line.get_label() for line in ax.get_lines()]


def test_plot_fit_draws_data_and_a_dense_curve_per_experiment(oscillator, data, run):
    _, trained = run
    fig = hk.plot_fit(
        trained,
        data,
        simulate_fn=oscillator.simulate_fn,
        state_to_output=oscillator.state_to_output,
        solver=oscillator.solver,
        n_points=50,
    )
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["exp0", "exp1", "exp2"]
    points, curve = visible[0].get_lines()
    assert len(points.get_xdata()) == 10 and len(curve.get_xdata()) == 50


def test_plot_fit_selects_experiments_and_rejects_unknown_ids(oscillator, data):
    kwargs = dict(
        simulate_fn=oscillator.simulate_fn,
        state_to_output=oscillator.state_to_output,
        solver=oscillator.solver,
        n_points=50,
    )
    fig = hk.plot_fit(omega_start(1.3), data, exp_ids=["exp2"], **kwargs)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["exp2"]
    with pytest.raises(ValueError, match="unknown exp_ids"):
        hk.plot_fit(omega_start(1.3), data, exp_ids=["nope"], **kwargs)
    with pytest.raises(ValueError, match="channel 'v' is not one of"):
        hk.plot_fit(omega_start(1.3), data, channels=["v"], **kwargs)
