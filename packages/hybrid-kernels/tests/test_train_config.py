"""OptaxTrainingConfig: validation on construction and the optimiser-switch rules."""

import math

import numpy as np
import optax
import pytest

import hybrid_kernels as hk


def cfg(**kwargs):
    kwargs.setdefault("steps", (5,))
    kwargs.setdefault("lr", (1e-2,) * len(kwargs["steps"]))
    return hk.OptaxTrainingConfig(**kwargs)


def test_single_phase_defaults_fill_every_phase_keyed_field():
    c = cfg(steps=(3, 4))
    assert c.optimizer == ("adamw", "adamw")
    assert c.reset_optimiser_state == (False, False)
    assert c.length_schedule == (1.0, 1.0)
    assert c.n_phases == 2 and c.total_steps == 7


def test_lists_are_normalised_to_tuples():
    c = hk.OptaxTrainingConfig(steps=[2, 3], lr=[0.1, 0.01], length_schedule=[0.5, 1])
    assert c.steps == (2, 3) and c.lr == (0.1, 0.01) and c.length_schedule == (0.5, 1.0)


def test_empty_steps_raise():
    with pytest.raises(ValueError, match="at least one phase"):
        cfg(steps=(), lr=())


@pytest.mark.parametrize("steps", [(0,), (3, -1)])
def test_steps_must_be_positive(steps):
    with pytest.raises(ValueError, match=r"OptaxTrainingConfig.steps\[\d\] must be an int >= 1"):
        cfg(steps=steps, lr=(0.1,) * len(steps))


def test_steps_must_be_ints_not_floats():
    with pytest.raises(TypeError, match=r"OptaxTrainingConfig.steps\[0\] must be an int, got 2\.5"):
        cfg(steps=(2.5,), lr=(0.1,))


def test_steps_must_be_a_tuple_not_a_number():
    with pytest.raises(ValueError, match="steps must be a tuple"):
        hk.OptaxTrainingConfig(steps=5, lr=(0.1,))


@pytest.mark.parametrize(
    "field, value",
    [
        ("lr", (0.1,)),
        ("optimizer", ("adamw",)),
        ("reset_optimiser_state", (False, True, False)),
        ("length_schedule", (1.0,)),
    ],
)
def test_phase_keyed_field_length_mismatch_raises(field, value):
    kwargs = {"steps": (2, 2), "lr": (0.1, 0.1), field: value}
    with pytest.raises(ValueError, match=f"{field} has {len(value)} entries but steps has 2"):
        hk.OptaxTrainingConfig(**kwargs)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.01, math.nan])
def test_length_fraction_outside_zero_one_raises(fraction):
    with pytest.raises(ValueError, match=r"length_schedule\[0\].*must lie in \(0, 1\]"):
        cfg(length_schedule=(fraction,))


def test_length_fraction_exactly_one_is_accepted():
    assert cfg(length_schedule=(1.0,)).length_schedule == (1.0,)


@pytest.mark.parametrize("lr", [-1e-3, math.inf, math.nan])
def test_bad_learning_rate_raises(lr):
    with pytest.raises(ValueError, match=r"lr\[0\]"):
        cfg(lr=(lr,))


def test_unknown_optimizer_name_lists_the_known_names():
    with pytest.raises(ValueError, match=r"not a known name.*adabelief"):
        cfg(optimizer=("adamm",))


def test_optimizer_names_are_case_and_space_insensitive():
    assert cfg(optimizer=(" AdaBelief ",)).optimizer == ("adabelief",)


def test_optimizer_that_is_neither_name_factory_nor_transformation_raises():
    with pytest.raises(ValueError, match="not a name, a factory"):
        cfg(optimizer=(3,))


def test_lbfgs_is_a_known_name():
    assert cfg(optimizer=("L-BFGS".replace("-", ""),)).optimizer == ("lbfgs",)


def test_objective_optimizers_are_accepted_as_instance_and_factory():
    line_search = optax.chain(optax.sgd(1.0), optax.scale_by_backtracking_linesearch(15))
    c = cfg(steps=(1, 1, 1), optimizer=(optax.lbfgs(), optax.lbfgs, line_search))
    assert c.optimizer[1] is optax.lbfgs


def test_factory_without_learning_rate_is_refused_with_a_message():
    def no_rate(memory_size=10):
        return optax.lbfgs(memory_size=memory_size)

    with pytest.raises(ValueError, match=r"optimizer\[0\].*cannot be called as.*learning_rate"):
        cfg(optimizer=(no_rate,))


def test_factory_that_does_not_build_a_transformation_is_refused_with_a_message():
    with pytest.raises(ValueError, match=r"optimizer\[0\].*returned float, not an optax"):
        cfg(optimizer=(lambda learning_rate: learning_rate,))


def test_factory_that_fails_when_called_is_refused_with_its_error():
    def broken(learning_rate):
        raise RuntimeError("no such optimiser")

    with pytest.raises(ValueError, match=r"optimizer\[0\].*failed.*no such optimiser"):
        cfg(optimizer=(broken,))


# --- optimiser switch rules --------------------------------------------------------------


def test_switching_optimizer_resets_its_state_by_default():
    c = cfg(steps=(2, 2, 2), optimizer=("adamw", "adabelief", "adabelief"))
    assert c.reset_optimiser_state == (False, True, False)


def test_none_entries_reset_where_the_optimizer_changes():
    c = cfg(steps=(2, 2, 2), optimizer=("adam", "adam", "lbfgs"), reset_optimiser_state=(None,) * 3)
    assert c.reset_optimiser_state == (False, False, True)


def test_keeping_state_across_an_optimizer_change_when_asked_explicitly_raises():
    with pytest.raises(ValueError, match=r"phase 1 changes optimizer.*reset_optimiser_state\[1\]"):
        cfg(steps=(2, 2), optimizer=("adamw", "adabelief"), reset_optimiser_state=(False, False))


def test_switching_optimizer_with_reset_is_allowed():
    c = cfg(steps=(2, 2), optimizer=("adamw", "sgd"), reset_optimiser_state=(False, True))
    assert c.optimizer == ("adamw", "sgd")


def test_same_optimizer_needs_no_reset_even_when_lr_changes():
    c = cfg(steps=(2, 2), lr=(0.1, 0.01), optimizer=("adam", "adam"))
    assert c.reset_optimiser_state == (False, False)


def test_same_factory_object_needs_no_reset():
    c = cfg(steps=(2, 2), optimizer=(optax.adam, optax.adam))
    assert c.optimizer[0] is c.optimizer[1]


def test_lr_change_on_a_raw_transformation_without_reset_raises():
    raw = optax.sgd(0.1)
    with pytest.raises(ValueError, match="rate is baked"):
        cfg(steps=(2, 2), lr=(0.1, 0.01), optimizer=(raw, raw))


def test_lr_change_on_a_raw_transformation_with_reset_is_allowed():
    raw = optax.sgd(0.1)
    c = cfg(steps=(2, 2), lr=(0.1, 0.01), optimizer=(raw, raw), reset_optimiser_state=(False, True))
    assert c.optimizer[1] is raw


def test_multi_steps_is_taken_as_its_gradient_transformation():
    c = cfg(optimizer=(optax.MultiSteps(optax.adam(0.1), every_k_schedule=2),))
    assert isinstance(c.optimizer[0], optax.GradientTransformation)


def test_phases_sharing_one_multi_steps_share_its_transformation_and_state():
    accumulate = optax.MultiSteps(optax.adam(0.1), every_k_schedule=2)
    c = cfg(steps=(2, 2), lr=(0.1, 0.1), optimizer=(accumulate, accumulate))
    assert c.optimizer[0] is c.optimizer[1]
    assert c.reset_optimiser_state == (False, False)


# --- penalties, loss, tournament, the rest ----------------------------------------------------


def test_penalty_weight_broadcasts_from_length_one():
    c = cfg(steps=(2, 3), penalty_weight=(0.5,))
    assert [c.penalty_weight_for_phase(p) for p in range(2)] == [0.5, 0.5]


def test_penalty_weight_per_phase():
    c = cfg(steps=(2, 3), penalty_weight=(0.0, 2.0))
    assert [c.penalty_weight_for_phase(p) for p in range(2)] == [0.0, 2.0]


def test_penalty_weight_bad_length_raises():
    with pytest.raises(ValueError, match="penalty_weight must have 1 entry"):
        cfg(steps=(2, 3), penalty_weight=(0.1, 0.2, 0.3))


@pytest.mark.parametrize("w, words", [(-1.0, "non-negative"), (math.inf, "finite")])
def test_penalty_weight_negative_or_non_finite_raises(w, words):
    with pytest.raises(ValueError, match=words):
        cfg(penalty_weight=(w,))


def test_penalty_points_must_be_rank_two():
    with pytest.raises(ValueError, match=r"penalty_points\[0\] must be a rank-2"):
        cfg(penalty_points=(np.zeros(3),))


def test_trajectory_weight_without_function_raises():
    with pytest.raises(ValueError, match="trajectory_penalty_fn is None"):
        cfg(trajectory_penalty_weight=1.0)


def test_unknown_reduction_raises():
    with pytest.raises(ValueError, match="reduction='mean'"):
        cfg(reduction="mean")


def test_unknown_monitor_raises():
    with pytest.raises(ValueError, match="monitor='test'"):
        cfg(monitor="test")


@pytest.mark.parametrize(
    "field, value",
    [
        ("tournament_attempts", 0),
        ("tournament_steps", -1),
        ("patience", -1),
        ("max_bad_steps", 0),
        ("log_every", 0),
        ("val_every", 0),
        ("checkpoint_every", -1),
    ],
)
def test_counts_out_of_range_raise(field, value):
    with pytest.raises(ValueError, match=field):
        cfg(**{field: value})


def test_checkpoint_every_needs_a_path():
    with pytest.raises(ValueError, match="checkpoint_path is None"):
        cfg(checkpoint_every=5)


def test_tournament_is_on_only_with_several_attempts_and_some_steps():
    assert not cfg(tournament_attempts=3).tournament_enabled()
    assert not cfg(tournament_steps=3).tournament_enabled()
    assert cfg(tournament_attempts=3, tournament_steps=2).tournament_enabled()


def test_config_is_frozen():
    c = cfg()
    with pytest.raises(AttributeError):
        c.steps = (1,)


def test_fingerprint_ignores_display_and_checkpoint_settings_only():
    a = cfg(verbose=True, log_every=1)
    assert a.fingerprint() == cfg(verbose=False, log_every=4).fingerprint()
    assert a.fingerprint() != cfg(lr=(0.5,)).fingerprint()
