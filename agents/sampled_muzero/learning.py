"""Sampled MuZero's learning: MuZero's learner update (`agents.muzero.learning`), its replay,
value and reward targets, with the policy trained by the sampled-policy improvement operator.

Each stored position holds the K pre-squash actions u_1..u_K sampled at the search's root
("samples" [K, D]) and the search's visit distribution over them ("policy" [K]). The policy
loss at unroll step k is the cross-entropy -sum_j pi_hat_j log pi(u_j | s_k) over the samples
of the position o_k (Hubert et al., 2021, section 4), minus `entropy_cost` times pi's entropy;
MuZero's own policy term is masked out (its softmax over A logits has no meaning here), and this
loss is added in its place through `learner_update`'s `extra_loss_fn`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agents.muzero import learning as mz
from agents.muzero import targets as tgt
from agents.muzero.learning import LearnConfig, LearnerState
from agents.sampled_muzero.networks import SampledMuZeroNetwork, entropy, from_env, gaussian
from agents.sampled_muzero.networks import log_prob as gaussian_log_prob
from podracer.types import Array, Metrics, PRNGKey, Trajectory


def to_replay_steps(trajectory: Trajectory, *, frames_once: bool, reward_scale: float,
                    low: Array, high: Array) -> tuple[dict, Array]:
    """MuZero's `to_replay_steps` with the action stored as the vector [D] g reads (the
    environment's action mapped back to [-1, 1]), and the root's samples [K, D] beside the
    visit distribution [K]."""
    steps, sampleable = mz.to_replay_steps(trajectory, frames_once=frames_once,
                                           reward_scale=reward_scale)
    steps["action"] = from_env(trajectory.action.astype(jnp.float32), low, high)
    steps["samples"] = trajectory.extras["samples"].astype(jnp.float32)
    return steps, sampleable


def policy_targets(windows: dict, learn: LearnConfig, *, history: int
                   ) -> tuple[Array, Array, Array]:
    """The policy targets of a batch of sampled windows: the visit distributions [S, K+1, K]
    (uniform at and past a terminal, as MuZero's `unroll_targets` makes them), where they are
    trained [S, K+1], and the samples they are over [S, K+1, K, D]."""
    ahead = jax.tree.map(lambda x: x[:, history:], windows)
    k1 = learn.unroll_steps + 1
    targets = jax.vmap(lambda r, d, st, pi: tgt.unroll_targets(
        r, d, st, pi, jnp.zeros((k1,), jnp.float32), num_unroll=learn.unroll_steps,
        n=learn.td_steps, discount=learn.discount, past_end=learn.past_end_targets))(
            ahead["reward"], ahead["discount"], ahead["step_type"].astype(jnp.int32),
            ahead["policy"])
    return targets.policy, targets.policy_mask, ahead["samples"][:, :k1]


def sampled_policy_loss(policy_params: Array, target: Array, mask: Array, samples: Array, *,
                        entropy_cost: Array | float, log_std_min: float, log_std_max: float
                        ) -> tuple[Array, Array, Array]:
    """For one position (unbatched): (sum over unroll steps k of m_k [-sum_j pi_hat_kj
    log pi(u_kj | s_k) - entropy_cost H(pi(s_k))], the cross-entropy part alone, the
    entropy part alone), from f's Gaussian parameters `policy_params` [K+1, 2D], the visit
    distributions `target` [K+1, K], the mask [K+1] and the samples [K+1, K, D]."""
    mean, log_std = gaussian(policy_params, log_std_min=log_std_min, log_std_max=log_std_max)
    log_pi = gaussian_log_prob(mean[:, None], log_std[:, None], samples)  # [K+1, K]
    cross_entropy = jnp.sum(mask * -jnp.sum(target * log_pi, axis=-1))
    ent = jnp.sum(mask * entropy(log_std))
    return cross_entropy - entropy_cost * ent, cross_entropy, ent


def learner_update(network: SampledMuZeroNetwork, optimizer, replay, learn: LearnConfig,
                   state: LearnerState, key: PRNGKey, *, history: int, axis_name: str | None,
                   log_std_min: float, log_std_max: float) -> tuple[LearnerState, Metrics]:
    """MuZero's `learner_update` (sampling, value and reward targets, unroll, gradient step,
    target copy, priorities) with the sampled policy loss in place of MuZero's: the targets'
    policy mask is zeroed and `sampled_policy_loss` comes in as the extra loss, divided by
    K + 1 as MuZero's terms are. Metrics: MuZero's, `policy_loss` being the sampled
    cross-entropy, and `policy_entropy` (nats, u-space, at step 0)."""
    k1 = learn.unroll_steps + 1
    entropy_cost = state.hparams["entropy_cost"]

    def targets_fn(windows, key):
        targets = mz.batch_targets(network, state.target_params, windows, key, learn,
                                   history=history)
        # MuZero's policy term, masked out: a placeholder target of f's output's width.
        placeholder = jnp.full(targets.policy.shape[:2] + (network.num_actions,),
                               1.0 / network.num_actions, jnp.float32)
        return targets.replace(policy=placeholder,
                               policy_mask=jnp.zeros_like(targets.policy_mask)), {}

    def extra_loss_fn(params, out, observations, windows, targets):
        del params, observations, targets  # its targets are the windows' stored samples
        target, mask, samples = policy_targets(windows, learn, history=history)
        total, cross_entropy, _ = jax.vmap(
            lambda p, t, m, s: sampled_policy_loss(
                p, t, m, s, entropy_cost=entropy_cost, log_std_min=log_std_min,
                log_std_max=log_std_max))(out.policy_logits, target, mask, samples)
        _, log_std = gaussian(out.policy_logits[:, 0], log_std_min=log_std_min,
                              log_std_max=log_std_max)
        metrics = {"policy_loss": jnp.mean(cross_entropy) / k1,
                   "policy_entropy": jnp.mean(entropy(log_std))}
        return total / k1, metrics

    # MuZero's own unroll (`losses.unroll_model`) reads the stored action vectors [S, K, D].
    return mz.learner_update(network, optimizer, replay, learn, state, key, history=history,
                             axis_name=axis_name, targets_fn=targets_fn,
                             extra_loss_fn=extra_loss_fn)
