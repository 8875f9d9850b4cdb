"""The V-trace agent's learner step against the IMPALA loss written directly over all T+1
observations: the agent computes x_T's forward pass apart, without a backward pass (its value
only bootstraps V-trace's targets, which carry no gradient), and must give the same update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agents.vtrace import default_config, make_agent, make_network, make_optimizer, vtrace_loss
from podracer.types import ArraySpec, DiscreteSpec, EnvSpec, StepType, TimeStep, Trajectory

T, B, A = 6, 5, 3


def test_learner_step_equals_the_loss_over_all_observations_in_one_pass():
    config = default_config()
    config.popart = False  # the plain IMPALA update; PopArt's: tests/test_vtrace_remedies.py
    spec = EnvSpec(observation=ArraySpec((4,), np.float32), action=DiscreteSpec(A))
    agent = make_agent(config, spec)
    state = agent.init(jax.random.PRNGKey(0), spec)
    rng = np.random.default_rng(0)
    step_type = np.full((T + 1, B), StepType.MID, np.int32)
    step_type[2, 1] = StepType.LAST  # a masked transition, and one ending on the last step
    step_type[3, 1] = StepType.FIRST
    step_type[T, 4] = StepType.LAST
    trajectory = Trajectory(
        timestep=TimeStep(step_type=jnp.asarray(step_type),
                          reward=jnp.asarray(rng.normal(size=(T + 1, B)), jnp.float32),
                          discount=jnp.asarray(rng.integers(0, 2, (T + 1, B)), jnp.float32),
                          observation=jnp.asarray(rng.normal(size=(T + 1, B, 4)), jnp.float32)),
        action=jnp.asarray(rng.integers(0, A, (T, B)), jnp.int32),
        extras={"logits": jnp.asarray(rng.normal(size=(T, B, A)), jnp.float32)})

    network = make_network(config, spec)
    hparams = {k: config[k] for k in ("discount", "lambda_", "clip_rho_threshold",
                                      "clip_pg_rho_threshold", "baseline_cost", "entropy_cost")}

    def reference_loss(params):
        obs = trajectory.timestep.observation
        logits, values = network.apply(params, obs.reshape(((T + 1) * B, 4)))
        logits, values = logits.reshape(T + 1, B, A), values.reshape(T + 1, B)
        out = jax.vmap(lambda *xs: vtrace_loss(*xs, **hparams), in_axes=1)(
            logits[:-1], values, trajectory.action, trajectory.extras["logits"],
            trajectory.timestep.reward[1:], trajectory.timestep.discount[1:],
            trajectory.transition_mask())
        return jnp.mean(out.loss)

    optimizer = make_optimizer(config)
    grads = jax.grad(reference_loss)(state.params)
    updates, _ = optimizer.update(grads, optimizer.init(state.params), state.params)
    expected = optax.apply_updates(state.params, updates)

    new_state, metrics = jax.jit(lambda s: agent.learner_step(s, trajectory, None,
                                                              axis_name=None))(state)
    np.testing.assert_allclose(metrics["loss"], reference_loss(state.params), rtol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 new_state.params, expected)


def test_the_step_size_anneals_linearly_to_zero_over_anneal_lr_updates():
    # With a constant gradient g, Adam's bias-corrected step is g / (|g| + eps): the step
    # size itself, lr, per coordinate. Annealed over 4 updates, update k (from 0) moves by
    # lr (1 - k / 4): 1, 3/4, 1/2, 1/4, then 0; with 0 updates it stays lr. (float32: the bias
    # corrections and square root round to about 1e-5 relative.)
    config = default_config()
    config.learning_rate, config.adam_eps = 0.1, 1e-12
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.asarray([0.5, -2.0, 3.0])}
    for anneal, fractions in ((4, (1.0, 0.75, 0.5, 0.25, 0.0, 0.0)), (0, (1.0,) * 6)):
        config.anneal_lr_updates = anneal
        optimizer = make_optimizer(config)
        state = optimizer.init(params)
        for k, fraction in enumerate(fractions):
            updates, state = optimizer.update(grads, state, params)
            np.testing.assert_allclose(updates["w"], -0.1 * fraction * np.sign(grads["w"]),
                                       rtol=1e-4, atol=1e-9, err_msg=f"{anneal=}, update {k}")
