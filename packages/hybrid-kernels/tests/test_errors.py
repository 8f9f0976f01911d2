"""`_errors.no_host_callbacks`: the one place that reaches into equinox's internals.

These tests pin the behaviour the `throw=False` kernels rely on, so a new equinox (or jax)
that moves the internal fails here, by name, rather than silently keeping host callbacks.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from hybrid_kernels._errors import host_callbacks_patchable, no_host_callbacks


def n_callbacks(x) -> int:
    """Callbacks in a fresh trace of a runtime check of `x`.

    Each call traces a new function: jax caches traces by function, and a cached trace made
    inside the switch would be reused outside it (which is why the kernels key the switch on
    the static `solver.throw`).
    """

    def checked(x):
        return eqx.error_if(x, x < 0, "negative")

    return str(jax.make_jaxpr(checked)(x)).count("callback")


def test_this_equinox_lets_the_switch_engage():
    assert host_callbacks_patchable()


def test_inside_the_switch_a_runtime_check_traces_without_a_callback():
    with no_host_callbacks():
        assert n_callbacks(jnp.asarray(1.0)) == 0


def test_inside_the_switch_a_failed_check_gives_nan_instead_of_raising():
    with no_host_callbacks():
        fn = jax.jit(lambda x: eqx.error_if(x, x < 0, "negative"))
        assert np.isnan(float(fn(jnp.asarray(-1.0))))
        assert float(fn(jnp.asarray(2.0))) == 2.0


def test_outside_the_switch_checks_keep_their_callback():
    with no_host_callbacks():
        pass
    assert n_callbacks(jnp.asarray(1.0)) > 0


def test_the_switch_is_restored_when_the_trace_raises():
    try:
        with no_host_callbacks():
            raise RuntimeError("trace failed")
    except RuntimeError:
        pass
    assert n_callbacks(jnp.asarray(1.0)) > 0


def test_a_disabled_switch_changes_nothing():
    with no_host_callbacks(enabled=False):
        assert n_callbacks(jnp.asarray(1.0)) > 0
