"""A bank as the learned activation of an equinox network, and the hook's boundary.

Equinox loops hand the optimizer `eqx.filter(model, eqx.is_inexact_array)`, which leaves
`None` for the bank's integer and bool blocks. The hook must get the whole model: given the
filtered one, it says so by name instead of failing inside the forward pass. Given a model
whose bank sits behind a plain function (`eqx.nn.MLP(activation=bank.forward)`), so that no
bank is in the pytree, it says that too instead of doing nothing.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import confluent_bank as cb

optax = pytest.importorskip("optax")

X = jnp.stack(jnp.meshgrid(jnp.linspace(-2, 2, 9), jnp.linspace(-2, 2, 9)), -1).reshape(-1, 2)
Y = jnp.sin(2 * X[:, 0]) * jnp.cos(X[:, 1])


class Net(eqx.Module):
    """`[2] -> []`: a linear layer, the bank elementwise on its 8 outputs, a linear layer."""

    inp: eqx.nn.Linear
    out: eqx.nn.Linear
    act: cb.ConfluentPackBank

    def __call__(self, x):
        return self.out(self.act.forward(self.inp(x)))[0]


def net():
    k1, k2 = jax.random.split(jax.random.key(0))
    bank = cb.init_confluent_bank(
        [cb.RefinedPack(0, c, 1.0, 1.5) for c in (-1.0, 1.0)], max_packs=6, max_order=1
    )
    return Net(eqx.nn.Linear(2, 8, key=k1), eqx.nn.Linear(8, 1, key=k2), bank)


def loss(model):
    return jnp.mean((jax.vmap(model)(X) - Y) ** 2)


def hooks():
    return {
        "growing": cb.TransitionHook.growing(loss, (-3.0, 3.0), every=1, plateau=np.inf),
        "plain": cb.TransitionHook(lambda step, path, bank: None, domain=(-3.0, 3.0)),
    }


@pytest.mark.parametrize("kind", ["growing", "plain"])
def test_a_filtered_bank_is_refused_naming_its_path_and_the_fix(kind):
    model = net()
    params = eqx.filter(model, eqx.is_inexact_array)
    state = optax.adam(1e-2).init(params)
    with pytest.raises(TypeError, match=r"bank at \.act has no orders, .*eqx\.combine"):
        hooks()[kind].between_steps(1, params, state)


def test_the_whole_network_grows_its_activation_and_keeps_training():
    model, hook = net(), hooks()["growing"]
    optimizer = optax.adam(1e-2)
    state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    before = float(loss(model))
    for step in (1, 2):  # the first check sets the objective's baseline, the second births
        model, state = hook.between_steps(step, model, state)
    births = [e for e in hook.events if e.kind == "zero_output_birth" and e.accepted]
    assert births and int(np.sum(np.asarray(model.act.active))) == 2 + len(births)
    assert float(loss(model)) < before  # the newborns' line searches lowered it
    # The carried state still fits the filtered model: an optax step runs on it.
    grads = eqx.filter_grad(loss)(model)
    updates, state = optimizer.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
    assert np.isfinite(float(loss(eqx.apply_updates(model, updates))))


@pytest.mark.parametrize("kind", ["growing", "plain"])
def test_predictors_without_a_bank_are_refused_naming_the_bound_method_pitfall(kind):
    # eqx.nn.MLP keeps a plain method as a static leaf: the bank behind it is not in the
    # pytree, so it would neither train nor grow, silently.
    bank = net().act
    model = eqx.nn.MLP(2, "scalar", 8, 1, activation=bank.forward, key=jax.random.key(0))
    state = optax.adam(1e-2).init(eqx.filter(model, eqx.is_inexact_array))
    with pytest.raises(ValueError, match=r"no ConfluentPackBank .*activation=bank\.forward"):
        hooks()[kind].between_steps(1, model, state)
