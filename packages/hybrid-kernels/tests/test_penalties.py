"""Bounded predictors and the bound penalty: scalers, point gathering, the penalty itself."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hybrid_kernels import (
    BoundedPredictor,
    BoundScaler,
    ChannelObs,
    apply_length_mask,
    bound_penalty,
    box_grid,
    data_penalty_points,
    make_dataset,
    make_experiment,
    select_penalty_points,
    validate_penalty_points,
)


def _mlp(n_in, n_out, seed=0):
    return eqx.nn.MLP(n_in, n_out, 4, 1, key=jax.random.key(seed))


class Shift(eqx.Module):
    """An inner module whose output latent is its input plus a chosen offset."""

    offset: jax.Array

    def __call__(self, z):
        return z[:1] + self.offset


def _bounded(offset=0.0, keys=("temp",), box=((0.0, 10.0),)):
    return BoundedPredictor(
        Shift(jnp.asarray([offset])),
        in_scaler=BoundScaler(box),
        out_scaler=BoundScaler([(0.0, 1.0)]),
        input_keys=keys,
    )


# --- BoundScaler -------------------------------------------------------------------------


@pytest.mark.parametrize("transform", ["sigmoid", "algebraic"])
@pytest.mark.parametrize("warp", ["linear", "log"])
def test_scaler_round_trip_is_identity_inside_the_box(transform, warp):
    scaler = BoundScaler([(1e-3, 1e2), (0.5, 2.0)], transform=transform, warp=warp)
    x = jnp.array([[2e-3, 0.6], [1.0, 1.0], [90.0, 1.99]])
    np.testing.assert_allclose(scaler.from_latent(scaler.to_latent(x)), x, rtol=1e-9)


def test_from_latent_never_leaves_the_box():
    scaler = BoundScaler([(-1.0, 3.0)])
    x = scaler.from_latent(jnp.array([[-1e6], [-30.0], [0.0], [30.0], [1e6]]))
    assert jnp.all((x >= -1.0) & (x <= 3.0))


def test_to_latent_outside_the_box_is_finite_with_nonzero_gradient():
    scaler = BoundScaler([(0.0, 1.0)])
    grad = jax.grad(lambda x: scaler.to_latent(x).sum())(jnp.array([-0.5, 1.5]))
    assert jnp.all(jnp.isfinite(scaler.to_latent(jnp.array([-0.5, 1.5]))))
    assert jnp.all(grad > 0)  # a hard clip would give exactly zero


def test_log_warp_puts_the_midpoint_at_the_geometric_mean():
    scaler = BoundScaler([(1e-4, 1e2)], warp="log")
    np.testing.assert_allclose(scaler.from_latent(jnp.zeros(1)), [1e-1], rtol=1e-12)


@pytest.mark.parametrize("transform", ["sigmoid", "algebraic"])
def test_default_knee_is_where_the_value_enters_the_outer_five_percent(transform):
    scaler = BoundScaler([(0.0, 1.0)], transform=transform)
    np.testing.assert_allclose(scaler.from_latent(jnp.array([scaler.z_knee])), [0.95], rtol=1e-12)
    if transform == "sigmoid":
        assert scaler.z_knee == pytest.approx(math.log(0.95 / 0.05))


def test_saturation_is_zero_below_the_knee_and_squared_excess_above():
    scaler = BoundScaler([(0.0, 1.0)], temperature=2.0, z_knee=3.0)
    assert scaler.saturation(jnp.array([5.9, -5.9, 0.0])) == 0.0
    # |z / T| = 4 and 5 exceed the knee by 1 and 2: mean of (1, 4, 0) squared excesses.
    np.testing.assert_allclose(scaler.saturation(jnp.array([8.0, -10.0, 1.0])), 5.0 / 3.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bounds": []}, "at least one"),
        ({"bounds": [(1.0, 1.0)]}, r"bounds\[0\] must be finite with low < high"),
        ({"bounds": [(0.0, math.inf)]}, "finite"),
        ({"bounds": [(0.0, 1.0)], "warp": "log"}, "positive bounds"),
        ({"bounds": [(0.0, 1.0)], "transform": "tanh"}, "transform must be one of"),
        ({"bounds": [(0.0, 1.0)], "warp": "sqrt"}, "warp must be one of"),
        ({"bounds": [(0.0, 1.0)], "temperature": 0.0}, "temperature must be"),
        ({"bounds": [(0.0, 1.0)], "z_knee": -1.0}, "z_knee"),
    ],
)
def test_scaler_rejects_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BoundScaler(**kwargs)


# --- BoundedPredictor ----------------------------------------------------------------------


def test_bounded_predictor_reads_named_inputs_in_key_order_and_ignores_extras():
    p = BoundedPredictor(
        _mlp(2, 1),
        in_scaler=BoundScaler([(0.0, 1.0), (0.0, 10.0)]),
        out_scaler=BoundScaler([(2.0, 3.0)]),
        input_keys=("a", "b"),
    )
    from_dict = p({"b": 4.0, "a": 0.5, "unused": 9.0})
    np.testing.assert_array_equal(from_dict, p(jnp.array([0.5, 4.0])))
    assert from_dict.shape == (1,) and 2.0 < float(from_dict[0]) < 3.0


def test_bounded_predictor_errors_name_the_problem():
    with pytest.raises(ValueError, match="input_keys must hold 2 distinct names"):
        BoundedPredictor(
            _mlp(2, 1),
            in_scaler=BoundScaler([(0, 1), (0, 1)]),
            out_scaler=BoundScaler([(0, 1)]),
            input_keys=("a",),
        )
    p = _bounded(keys=("a",))
    with pytest.raises(KeyError, match="lack"):
        p({"b": 1.0})
    wide = BoundedPredictor(_mlp(1, 2), in_scaler=BoundScaler([(0, 1)]), out_scaler=p.out_scaler)
    with pytest.raises(ValueError, match=r"inner returned shape \(2,\); expected \(1,\)"):
        wide(jnp.array([0.5]))
    assert wide.input_keys == ("x1",)


# --- bound_penalty ---------------------------------------------------------------------------


def test_bound_penalty_is_zero_when_nothing_saturates():
    points = (jnp.array([[1.0], [5.0], [9.0]]),)
    assert bound_penalty((_bounded(offset=0.0),), points) == 0.0


def test_bound_penalty_equals_the_out_scaler_saturation_of_the_latents():
    p = _bounded(offset=4.0)
    pts = jnp.array([[5.0], [9.9]])
    latents = jnp.stack([p.inner(p.in_scaler.to_latent(x)) for x in pts])
    expected = jnp.mean(jnp.maximum(jnp.abs(latents) - p.out_scaler.z_knee, 0) ** 2)
    assert expected > 0
    np.testing.assert_allclose(bound_penalty((p,), (pts,)), expected, rtol=1e-12)


def test_empty_point_arrays_add_exactly_zero():
    saturated = _bounded(offset=10.0)
    other = _bounded(offset=10.0, keys=("b",))
    alone = bound_penalty((saturated,), (jnp.array([[5.0]]),))
    both = bound_penalty((saturated, other), (jnp.array([[5.0]]), jnp.zeros((0, 0))))
    assert alone > 0 and both == alone


def test_bound_penalty_does_not_depend_on_the_container():
    a, b = _bounded(offset=5.0), _bounded(offset=-6.0, keys=("b",))
    pts = (jnp.array([[5.0]]), jnp.array([[2.0]]))
    as_tuple = bound_penalty((a, b), pts)
    assert bound_penalty([a, b], pts) == as_tuple
    assert bound_penalty({"first": a, "second": b}, pts) == as_tuple


def test_nested_bounded_predictors_are_found_outer_first():
    inner_node = _bounded(offset=7.0, keys=("inner",))
    outer = BoundedPredictor(
        inner_node,
        in_scaler=BoundScaler([(0.0, 10.0)]),
        out_scaler=BoundScaler([(0.0, 1.0)]),
        input_keys=("outer",),
    )
    only_inner = bound_penalty((outer,), (jnp.zeros((0, 0)), jnp.array([[5.0]])))
    assert only_inner == bound_penalty((inner_node,), (jnp.array([[5.0]]),)) > 0
    with pytest.raises(ValueError, match="2 BoundedPredictor nodes"):
        bound_penalty((outer,), (jnp.array([[5.0]]),))


def test_bound_penalty_gradient_reaches_the_inner_weights():
    p = BoundedPredictor(
        _mlp(1, 1),
        in_scaler=BoundScaler([(0.0, 1.0)]),
        out_scaler=BoundScaler([(0.0, 1.0)]),
    )
    # Push the output bias far past the knee so the penalty is active.
    p = eqx.tree_at(lambda q: q.inner.layers[-1].bias, p, jnp.array([20.0]))
    grads = eqx.filter_grad(lambda q: bound_penalty((q,), (jnp.array([[0.3], [0.7]]),)))(p)
    assert float(jnp.abs(grads.inner.layers[-1].bias).sum()) > 0
    assert float(jnp.abs(grads.inner.layers[0].weight).sum()) > 0


def test_bound_penalty_rejects_points_with_the_wrong_columns():
    with pytest.raises(ValueError, match=r"points\[0\] has shape \(3, 2\); expected \(G, 1\)"):
        bound_penalty((_bounded(),), (jnp.ones((3, 2)),))


# --- box_grid --------------------------------------------------------------------------------


def test_box_grid_shape_and_log_uniform_axes():
    scaler = BoundScaler([(1e-3, 1e1), (1.0, 16.0)], warp="log")
    grid = np.asarray(box_grid(scaler, n_per_dim=4))
    assert grid.shape == (16, 2)
    log_axis = np.log10(np.unique(grid[:, 0]))
    np.testing.assert_allclose(np.diff(log_axis), np.full(3, 1.0), rtol=1e-12)  # 4 decades / 4
    np.testing.assert_allclose(np.diff(np.log2(np.unique(grid[:, 1]))), np.full(3, 1.0))
    assert np.all((grid[:, 0] > 1e-3) & (grid[:, 0] < 1e1))  # cell centres, never on a bound


def test_box_grid_is_deterministic_and_validates_n_per_dim():
    scaler = BoundScaler([(0.0, 1.0)])
    np.testing.assert_array_equal(box_grid(scaler, 3), box_grid(scaler, 3))
    with pytest.raises(ValueError, match="`n_per_dim` must be an int >= 2"):
        box_grid(scaler, 1)
    with pytest.raises(TypeError, match="`n_per_dim` must be an int"):
        box_grid(scaler, 2.5)


# --- data points, the length mask, selection and validation ----------------------------------


def _experiment(temp, times, exp_id, probe=False, extra_cov=None):
    covariates = {"temp": temp, "pressure": 2.0 * temp}
    if extra_cov is not None:
        covariates["vec"] = extra_cov
    values = [] if probe else np.arange(len(times), dtype=float)
    return make_experiment(
        covariates=covariates,
        channels={"c": ChannelObs(times, values)},
        y0_fn=lambda cov, ch: jnp.zeros(1),
        exp_id=exp_id,
    )


@pytest.fixture(scope="module")
def dataset():
    experiments = [
        _experiment(1.0, [0.0, 1.0, 2.0, 3.0], "a"),
        _experiment(2.0, [0.0, 0.5, 1.5, 2.5, 3.5, 4.5], "b"),
        _experiment(3.0, [0.0, 1.0, 2.0], "probe", probe=True),
    ]
    return make_dataset(experiments, output_channel_names=("c",), max_shapes=1)


def test_data_points_have_one_row_per_measured_cell_and_skip_probes(dataset):
    node = _bounded(keys=("pressure", "temp"), box=((0.0, 10.0), (0.0, 10.0)))
    node = eqx.tree_at(lambda p: p.inner, node, Shift(jnp.zeros(1)))
    (source,) = data_penalty_points((node,), dataset)
    assert len(dataset.bucket_payloads) == 1  # all padded into one shape of T = 6
    assert source.points.shape == (4 + 6, 2)
    rows = sorted(map(tuple, source.points.tolist()))
    assert rows == [(2.0, 1.0)] * 4 + [(4.0, 2.0)] * 6  # columns follow input_keys
    assert sorted(source.cell_T.tolist()) == [4] * 4 + [6] * 6


def test_inputs_that_are_not_covariates_give_no_source(dataset):
    assert data_penalty_points((_bounded(keys=("state",)),), dataset) == (None,)


def test_vector_covariate_feeding_a_bounded_predictor_raises():
    ds = make_dataset(
        [_experiment(1.0, [0.0, 1.0], "v", extra_cov=[1.0, 2.0])], output_channel_names=("c",)
    )
    with pytest.raises(ValueError, match="covariate 'vec' feeds"):
        data_penalty_points((_bounded(keys=("vec",)),), ds)


def test_selected_data_points_take_each_rows_own_prefix(dataset):
    # Experiment "a" (temp 1) has length 4, "b" (temp 2) length 6, padded to one T = 6.
    sources = data_penalty_points((_bounded(keys=("temp",)),), dataset)
    (half,) = select_penalty_points(sources, (), 0.5)
    assert sorted(np.asarray(half)[:, 0].tolist()) == [1.0] * 2 + [2.0] * 3
    (tiny,) = select_penalty_points(sources, (), 0.05)
    assert sorted(np.asarray(tiny)[:, 0].tolist()) == [1.0, 2.0]  # at least one row each


def test_select_penalty_points_concatenates_kept_data_and_extras(dataset):
    nodes = (_bounded(keys=("temp",)), _bounded(keys=("state",)), _bounded(keys=("other",)))
    sources = data_penalty_points(nodes, dataset)
    extra = np.array([[7.0], [8.0]])
    first, second, third = select_penalty_points(sources, (extra, extra, None), fraction=0.5)
    np.testing.assert_array_equal(first, [[1.0], [1.0], [2.0], [2.0], [2.0], [7.0], [8.0]])
    np.testing.assert_array_equal(second, extra)
    assert third.shape == (0, 0)


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_select_penalty_points_rejects_fractions_outside_unit_interval(dataset, fraction):
    sources = data_penalty_points((_bounded(),), dataset)
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\]"):
        select_penalty_points(sources, (), fraction)


def test_select_penalty_points_needs_a_concrete_fraction(dataset):
    sources = data_penalty_points((_bounded(),), dataset)
    with pytest.raises(TypeError, match="concrete Python float"):
        jax.jit(lambda f: select_penalty_points(sources, (), f)[0])(0.5)
    with pytest.raises(ValueError, match="one entry per bounded predictor"):
        select_penalty_points(sources, (None, None), 1.0)


def test_validate_penalty_points_requires_coverage_only_when_enabled(dataset):
    nodes = (_bounded(keys=("temp",)), _bounded(keys=("state",)))
    sources = data_penalty_points(nodes, dataset)
    with pytest.raises(ValueError, match=r"node 1 .* trajectory penalty"):
        validate_penalty_points(nodes, sources, enabled=True)
    validate_penalty_points(nodes, sources, enabled=False)
    validate_penalty_points(nodes, sources, (None, np.ones((3, 1))), enabled=True)


@pytest.mark.parametrize(
    ("extras", "match"),
    [
        ((None,), "one entry per BoundedPredictor node"),
        ((None, np.ones((3, 2))), r"extras\[1\] has shape \(3, 2\); expected \(G, 1\)"),
        ((None, np.ones(3)), r"extras\[1\] has shape \(3,\)"),
        ((None, np.array([[np.nan]])), "non-finite"),
    ],
)
def test_validate_penalty_points_rejects_malformed_extras(dataset, extras, match):
    nodes = (_bounded(keys=("temp",)), _bounded(keys=("state",)))
    sources = data_penalty_points(nodes, dataset)
    with pytest.raises(ValueError, match=match):
        validate_penalty_points(nodes, sources, extras, enabled=False)


def test_validate_penalty_points_checks_the_source_count(dataset):
    nodes = (_bounded(),)
    with pytest.raises(ValueError, match="sources holds 2 entries"):
        validate_penalty_points(nodes, (None, None), enabled=False)


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.7, 1.0])
def test_selected_data_points_are_the_cells_apply_length_mask_keeps(dataset, fraction):
    (bp,) = dataset.bucket_payloads
    (source,) = data_penalty_points((_bounded(keys=("temp",)),), dataset)
    rows, times = np.nonzero(np.asarray(bp.mask).any(axis=-1))  # the order sources use
    kept_by_kernel = np.asarray(apply_length_mask(bp, jnp.asarray(fraction)).mask.any(axis=-1))
    (selected,) = select_penalty_points((source,), (), fraction)
    np.testing.assert_array_equal(selected, source.points[kept_by_kernel[rows, times]])
