"""Clipped LARS (podracer.optim): hand-computed trust ratios, the zero-norm and mask rules,
composition with momentum and a warm-up schedule, and agreement with optax's unclipped LARS
scaling wherever the ratio is below 1.

Trust ratio of a layer: min(eta ||w|| / (||g|| + beta ||w||), 1); the step is ratio (g + beta w).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from podracer import optim


def _update(tx, grads, params):
    state = tx.init(params)
    updates, _ = tx.update(grads, state, params)
    return updates


def test_one_layer_clipped_the_other_not():
    params = {"a": jnp.array([[3.0, 4.0]]), "b": jnp.array([[6.0, 8.0]])}  # norms 5 and 10
    grads = {"a": jnp.array([[0.0, 10.0]]), "b": jnp.array([[1.0, 0.0]])}  # norms 10 and 1
    # No weight decay, eta = 0.5:
    #   a: 0.5 * 5 / 10 = 0.25          -> step 0.25 * [0, 10] = [0, 2.5]
    #   b: 0.5 * 10 / 1 = 5 > 1, so 1   -> step [1, 0] (unclipped LARS would multiply by 5)
    updates = _update(optim.scale_by_clipped_trust_ratio(0.5), grads, params)
    np.testing.assert_allclose(updates["a"], [[0.0, 2.5]], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [[1.0, 0.0]], rtol=1e-6)
    # Weight decay beta = 0.5, eta = 2:
    #   a: 2 * 5 / (10 + 0.5 * 5) = 10 / 12.5 = 0.8
    #      step 0.8 * ([0, 10] + 0.5 * [3, 4]) = 0.8 * [1.5, 12] = [1.2, 9.6]
    #   b: 2 * 10 / (1 + 0.5 * 10) = 20 / 6 > 1, so 1
    #      step [1, 0] + 0.5 * [6, 8] = [4, 4]
    updates = _update(optim.scale_by_clipped_trust_ratio(2.0, 0.5), grads, params)
    np.testing.assert_allclose(updates["a"], [[1.2, 9.6]], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [[4.0, 4.0]], rtol=1e-6)


def test_zero_norm_layers_get_ratio_one_and_no_nan():
    params = {"zero_w": jnp.zeros((2, 2)), "zero_g": jnp.array([[3.0, 4.0]])}
    grads = {"zero_w": jnp.array([[1.0, 2.0], [3.0, 4.0]]), "zero_g": jnp.zeros((1, 2))}
    for beta in (0.0, 0.5):
        updates = _update(optim.scale_by_clipped_trust_ratio(0.1, beta), grads, params)
        # ||w|| = 0: the formula would give ratio 0 (a zero layer never moves); it is 1.
        np.testing.assert_array_equal(updates["zero_w"], grads["zero_w"])
        # ||g|| = 0: ratio 1, so the step is the weight decay alone, beta * [3, 4].
        np.testing.assert_allclose(updates["zero_g"], [[3.0 * beta, 4.0 * beta]], rtol=1e-6)
    # Both zero: 0/0 nowhere, a zero step.
    updates = _update(optim.scale_by_clipped_trust_ratio(0.1, 0.5),
                      {"w": jnp.zeros((2, 3))}, {"w": jnp.zeros((2, 3))})
    np.testing.assert_array_equal(updates["w"], np.zeros((2, 3)))


def test_mask_leaves_biases_untouched():
    params = {"kernel": jnp.array([[3.0, 4.0]]), "bias": jnp.array([6.0, 8.0])}
    grads = {"kernel": jnp.array([[0.0, 10.0]]), "bias": jnp.array([100.0, 0.0])}
    # Default mask: rank >= 2 only. The kernel: 0.5 * 5 / (10 + 0.1 * 5) = 2.5 / 10.5, times
    # [0, 10] + 0.1 * [3, 4] = [0.3, 10.4]. The bias: unchanged, no weight decay either.
    updates = _update(optim.scale_by_clipped_trust_ratio(0.5, 0.1), grads, params)
    np.testing.assert_allclose(updates["kernel"], [[0.3 * 2.5 / 10.5, 10.4 * 2.5 / 10.5]],
                               rtol=1e-6)
    np.testing.assert_array_equal(updates["bias"], grads["bias"])
    # An explicit pytree mask, and a callable one, selecting the bias instead:
    #   bias: 0.5 * 10 / (100 + 0.1 * 10) = 5 / 101, times [100.6, 0.8].
    for mask in ({"kernel": False, "bias": True},
                 lambda p: jax.tree.map(lambda x: x.ndim == 1, p)):
        updates = _update(optim.scale_by_clipped_trust_ratio(0.5, 0.1, mask=mask), grads, params)
        np.testing.assert_array_equal(updates["kernel"], grads["kernel"])
        np.testing.assert_allclose(updates["bias"], [100.6 * 5 / 101, 0.8 * 5 / 101], rtol=1e-6)
    # Every leaf scaled.
    updates = _update(optim.scale_by_clipped_trust_ratio(
        0.5, 0.1, mask={"kernel": True, "bias": True}), grads, params)
    np.testing.assert_allclose(updates["bias"], [100.6 * 5 / 101, 0.8 * 5 / 101], rtol=1e-6)
    np.testing.assert_allclose(updates["kernel"], [[0.3 * 2.5 / 10.5, 10.4 * 2.5 / 10.5]],
                               rtol=1e-6)


def test_clipped_lars_with_momentum_and_warmup_over_three_steps():
    # Gradients g = c * w (the loss c/2 ||w||^2) keep the ratio fixed as w shrinks, since the
    # ratio eta ||w|| / (c ||w|| + beta ||w||) = eta / (c + beta) does not depend on ||w||.
    # eta = 1, beta = 0.5, momentum 0.9, learning rate warming up 0.1, 0.2, 0.3.
    #   "a" (c = 1.5): ratio 1 / 2 = 0.5, step 0.5 * (1.5 + 0.5) w = 1.0 w
    #   "b" (c = 0.25): ratio 1 / 0.75 > 1, so 1; step (0.25 + 0.5) w = 0.75 w
    #   "bias" (c = 2, rank 1, masked out): plain momentum SGD on g = 2 w, no decay
    # With w_t = s_t w_0 and the momentum v_t = p_t w_0, p' = 0.9 p + k s, s' = s - lr p':
    #   k = 1:    p 1, 1.8, 2.16;            s 0.9, 0.54, 0.54 - 0.648 = -0.108
    #   k = 0.75: p 0.75, 1.36875, 1.7203125; s 0.925, 0.65125, 0.65125 - 0.51609375 = 0.13515625
    #   k = 2:    p 2, 3.4, 3.3;             s 0.8, 0.12, 0.12 - 0.99 = -0.87
    # (had the bias been scaled too, its ratio 1 / 2.5 would make k = 1: s = -0.108.)
    w0 = {"a": jnp.array([[3.0, 4.0]]), "b": jnp.array([[1.0, -2.0], [2.0, 0.5]]),
          "bias": jnp.array([0.5, -1.0])}
    c = {"a": 1.5, "b": 0.25, "bias": 2.0}
    warmup = optax.linear_schedule(init_value=0.1, end_value=0.3, transition_steps=2)
    tx = optim.clipped_lars(warmup, eta=1.0, momentum=0.9, weight_decay=0.5)

    @jax.jit
    def step(params, state):
        grads = {k: c[k] * v for k, v in params.items()}
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params, state = w0, tx.init(w0)
    for _ in range(3):
        params, state = step(params, state)
    expected = {"a": -0.108, "b": 0.13515625, "bias": -0.87}
    for k, s in expected.items():
        np.testing.assert_allclose(params[k], s * w0[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_jitted_updates_are_the_hand_worked_ones():
    # The weight-decay case of test_one_layer_clipped_the_other_not, compiled: a's ratio
    # 0.8, step [1.2, 9.6]; b's clipped to 1, step [4, 4].
    params = {"a": jnp.array([[3.0, 4.0]]), "b": jnp.array([[6.0, 8.0]])}
    grads = {"a": jnp.array([[0.0, 10.0]]), "b": jnp.array([[1.0, 0.0]])}
    tx = optim.scale_by_clipped_trust_ratio(2.0, 0.5)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["a"], [[1.2, 9.6]], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [[4.0, 4.0]], rtol=1e-6)


def test_agrees_with_optax_trust_ratio_where_below_one():
    # optax.scale_by_trust_ratio is LARS's scaling without the clip (and without weight decay in
    # the denominator): with beta = 0 the two agree wherever eta ||w|| / ||g|| < 1.
    eta = 0.02
    rng = np.random.default_rng(0)
    params = {f"w{i}": jnp.asarray(rng.normal(size=(4 + i, 3)), jnp.float32) for i in range(3)}
    grads = {f"w{i}": jnp.asarray(10 * rng.normal(size=(4 + i, 3)), jnp.float32)
             for i in range(3)}
    ratios = {k: eta * np.linalg.norm(params[k]) / np.linalg.norm(grads[k]) for k in params}
    assert all(r < 1 for r in ratios.values())
    ours = _update(optim.scale_by_clipped_trust_ratio(eta, 0.0), grads, params)  # all rank 2
    reference = _update(optax.scale_by_trust_ratio(trust_coefficient=eta), grads, params)
    for k in params:
        np.testing.assert_allclose(ours[k], reference[k], rtol=1e-5)
    # Where the ratio exceeds 1, optax enlarges the step and the clipped version does not.
    big_eta = 100.0
    ours = _update(optim.scale_by_clipped_trust_ratio(big_eta, 0.0), grads, params)
    reference = _update(optax.scale_by_trust_ratio(trust_coefficient=big_eta), grads, params)
    for k in params:
        np.testing.assert_allclose(ours[k], grads[k], rtol=1e-6)
        assert np.linalg.norm(reference[k]) > np.linalg.norm(grads[k])


def test_needs_params():
    tx = optim.scale_by_clipped_trust_ratio(0.1)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update({"w": jnp.ones((2, 2))}, tx.init({"w": jnp.ones((2, 2))}))


def test_hyperparameters_can_live_in_the_optimiser_state():
    # As MuZero holds its optimiser's hyperparameters (optax.inject_hyperparams), so that one
    # compiled program serves several values: the same steps as the plain chain.
    params = {"a": jnp.array([[3.0, 4.0]]), "b": jnp.array([[6.0, 8.0]]), "c": jnp.ones(3)}
    grads = {"a": jnp.array([[0.0, 10.0]]), "b": jnp.array([[1.0, 0.0]]), "c": jnp.ones(3)}
    plain = optim.clipped_lars(0.1, eta=0.5, momentum=0.9, weight_decay=0.01)
    injected = optax.inject_hyperparams(optim.clipped_lars)(
        learning_rate=0.1, eta=0.5, momentum=0.9, weight_decay=0.01)
    state = injected.init(params)
    assert float(state.hyperparams["eta"]) == 0.5
    # A function mask must be static there (inject_hyperparams takes functions for schedules).
    with_mask = optax.inject_hyperparams(optim.clipped_lars, static_args=("mask",))(
        learning_rate=0.1, eta=0.5, momentum=0.9, weight_decay=0.01, mask=optim.matrices_only)
    expected, _ = plain.update(grads, plain.init(params), params)
    got, _ = jax.jit(injected.update)(grads, state, params)
    for k in params:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-6)
    got, _ = with_mask.update(grads, with_mask.init(params), params)
    for k in params:
        np.testing.assert_allclose(got[k], expected[k], rtol=1e-6)
