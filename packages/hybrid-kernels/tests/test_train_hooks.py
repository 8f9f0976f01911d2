"""The between-steps hook: edits between optimiser steps, validated, with no recompiles."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import TRACES, flag_config, flag_train, osc_dataset, set_flag

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


def test_hook_runs_between_steps_never_after_the_last(clean):
    calls = []

    def hook(step, predictors, opt_state):
        calls.append(step)

    history, _ = flag_train(clean, flag_config(steps=(3, 2), lr=(0.05, 0.01)), hooks=hook)
    assert calls == [1, 2, 3, 4]  # after each of the 5 steps but the last
    assert len(history) == 5


def test_hook_edits_are_used_by_the_next_step(clean):
    def hook(step, predictors, opt_state):
        if step == 2:
            return eqx.tree_at(lambda p: p[0].omega, predictors, jnp.asarray(1.3)), opt_state
        return None

    config = flag_config(steps=(4,), lr=(0.0,))
    history, _ = flag_train(clean, config, hooks=hook)
    assert history[0] == history[1] > 1e-3  # lr 0: nothing moves by itself
    assert history[2] < 1e-12  # the hook set the true frequency before step 2


def test_value_and_integer_metadata_edits_do_not_recompile(clean):
    flag_train(clean, flag_config(steps=(2,)))  # compile this shape once
    before = dict(TRACES)

    class Edit:
        def between_steps(self, step, predictors, opt_state):
            p = eqx.tree_at(lambda p: p[0].omega, predictors, predictors[0].omega * 1.01)
            p = set_flag(p, 0)  # integer metadata, rewritten every step
            state = jax.tree.map(lambda x: x * 1.0 if eqx.is_inexact_array(x) else x, opt_state)
            return p, state

    history, _ = flag_train(clean, flag_config(steps=(6,)), hooks=Edit())
    assert len(history) == 6 and np.all(np.isfinite(history))
    assert TRACES == before  # neither simulate_fn nor the penalty retraced


_BACKEND_COMPILES: list[str] = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, *_, **__: (
        _BACKEND_COMPILES.append(name)
        if name == "/jax/core/compile/backend_compile_duration"
        else None
    )
)


def test_committed_replacements_are_placed_like_the_run_without_recompiling(clean):
    # jit compiles once per input placement: arrays device_put on a device (committed) where
    # the run had uncommitted ones would recompile every kernel although nothing retraces.
    device = jax.devices()[0]

    def commit_everything(step, predictors, opt_state):
        place = lambda x: jax.device_put(x, device) if eqx.is_array(x) else x  # noqa: E731
        return jax.tree.map(place, predictors), jax.tree.map(place, opt_state)

    flag_train(clean, flag_config(steps=(3,)), hooks=lambda step, p, s: (p, s))  # warm up
    before = len(_BACKEND_COMPILES)
    history, _ = flag_train(clean, flag_config(steps=(4,)), hooks=commit_everything)
    assert len(history) == 4 and np.all(np.isfinite(history))
    assert len(_BACKEND_COMPILES) == before


def test_numpy_and_weak_typed_replacements_are_conformed_without_recompiling(clean):
    flag_train(clean, flag_config(steps=(2,)))
    before = dict(TRACES)

    def hook(step, predictors, opt_state):
        p = eqx.tree_at(lambda p: p[0].omega, predictors, jnp.asarray(1.2))  # weak-typed
        return eqx.tree_at(lambda p: p[1].flag, p, np.asarray(0, np.int32)), opt_state

    history, _ = flag_train(clean, flag_config(steps=(4,)), hooks=hook)
    assert TRACES == before and len(history) == 4


def test_what_a_hook_returns_untouched_is_passed_on_as_it_is():
    # A hook runs after every step; re-checking and rebuilding what it did not touch (often the
    # whole optimizer state) would cost every step for nothing.
    from hybrid_kernels._training.hooks import apply_hook

    predictors = {"rate": jnp.asarray(0.3), "kept": jnp.arange(3.0)}
    opt_state = ({"mu": jnp.zeros(3)}, jnp.asarray(2))

    def hook(step, predictors, opt_state):
        return {**predictors, "rate": jnp.asarray(0.5)}, opt_state

    new_predictors, new_state, changed = apply_hook(hook, 1, predictors, opt_state)
    assert changed and new_state is opt_state
    assert new_predictors["kept"] is predictors["kept"]
    assert float(new_predictors["rate"]) == 0.5


def test_changed_structure_raises(clean):
    def hook(step, predictors, opt_state):
        return (*predictors, predictors[0]), opt_state

    with pytest.raises(ValueError, match="changed the pytree structure of predictors after step 1"):
        flag_train(clean, flag_config(steps=(3,)), hooks=hook)


def test_changed_leaf_shape_raises(clean):
    def hook(step, predictors, opt_state):
        return eqx.tree_at(lambda p: p[0].omega, predictors, jnp.ones(2)), opt_state

    with pytest.raises(ValueError, match=r"changed predictors\[0\]\.omega from shape \(\)"):
        flag_train(clean, flag_config(steps=(3,)), hooks=hook)


def test_changed_dtype_raises(clean):
    def hook(step, predictors, opt_state):
        return eqx.tree_at(lambda p: p[1].flag, predictors, jnp.asarray(0.5)), opt_state

    with pytest.raises(ValueError, match="dtypes must stay the same"):
        flag_train(clean, flag_config(steps=(3,)), hooks=hook)


def test_changed_optimizer_state_structure_raises(clean):
    def hook(step, predictors, opt_state):
        return predictors, (opt_state, opt_state)

    with pytest.raises(ValueError, match="pytree structure of opt_state"):
        flag_train(clean, flag_config(steps=(3,)), hooks=hook)


def test_hook_must_return_none_or_a_pair(clean):
    with pytest.raises(TypeError, match="expected None or a \\(predictors, opt_state\\) tuple"):
        flag_train(clean, flag_config(steps=(3,)), hooks=lambda s, p, o: p[0])


def test_hooks_must_be_callable_or_have_between_steps(clean):
    with pytest.raises(TypeError, match="no between_steps"):
        flag_train(clean, flag_config(steps=(3,)), hooks=42)


def test_hook_object_satisfies_the_protocol():
    class Hook:
        def between_steps(self, step, predictors, opt_state):
            return None

    assert isinstance(Hook(), hk.BetweenStepsHook)


def test_an_error_in_a_hook_propagates_and_closes_the_ui_run(clean):
    ui = hk.RecordingUI()

    def boom(step, predictors, opt_state):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        flag_train(clean, flag_config(steps=(3,)), hooks=boom, ui=ui)
    assert ui.events[-1] == ("on_run_end", {"final_loss": pytest.approx(float("nan"), nan_ok=True)})
    # The display's last message names the error, so its end does not read as a finished run.
    stopped = "training stopped by RuntimeError after 1 step"
    assert ui.events[-2] == ("on_message", {"text": stopped})
