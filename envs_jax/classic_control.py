"""Classic control in JAX: CartPole-v1, Acrobot-v1, MountainCar-v0 and Pendulum-v1.

Each reproduces gymnasium's `gymnasium.envs.classic_control` environment of the same name:
the same constants, integrator, reset distribution, observation, reward and termination, so
`tests/test_envs_classic_control.py` steps gymnasium beside them from the same state with the
same actions and checks every step. The only deliberate difference is precision: the state is
float32 (gymnasium computes in float64), so observations agree to float32 tolerance.

Their standard time limits (gymnasium's `max_episode_steps`) are applied by `envs_jax.make`,
not here: `MAX_EPISODE_STEPS` lists them. Their dynamics are deterministic, so the state holds
no RNG key (a reset is all the randomness there is).
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.base import Environment
from podracer.types import Array, ArraySpec, DiscreteSpec, PRNGKey, StepType, TimeStep

# gymnasium's registered time limits.
MAX_EPISODE_STEPS = {
    "CartPole-v1": 500,
    "Acrobot-v1": 500,
    "MountainCar-v0": 200,
    "Pendulum-v1": 200,
}


@chex.dataclass(frozen=True)
class PhysicsState:
    """The physical state, laid out exactly as gymnasium's `env.unwrapped.state`."""

    physics: Array  # [n] float32


def _first(observation: Array) -> TimeStep:
    return TimeStep(
        step_type=jnp.asarray(StepType.FIRST, jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        discount=jnp.ones((), jnp.float32),
        observation=observation,
    )


def _transition(terminated: Array, reward: Array, observation: Array) -> TimeStep:
    return TimeStep(
        step_type=jnp.where(terminated, StepType.LAST, StepType.MID).astype(jnp.int32),
        reward=jnp.asarray(reward, jnp.float32),
        discount=jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
        observation=observation,
    )


class _ClassicControl(Environment[PhysicsState]):
    """Shared plumbing: the state is one float32 vector; subclasses give the physics."""

    def observation_spec(self) -> ArraySpec:
        high = self._observation_high()
        return ArraySpec(high.shape, np.float32, -high, high, name="observation")

    def _observation_high(self) -> np.ndarray:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------


class CartPole(_ClassicControl):
    """Balance a pole on a cart (Barto, Sutton and Anderson, 1983); gymnasium's CartPole-v1.

    Actions: 0 pushes left, 1 pushes right. Reward +1 every step, the terminal one included.
    The episode terminates when |x| > 2.4 or |theta| > 12 degrees.
    """

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds per step
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def reset(self, key: PRNGKey) -> tuple[PhysicsState, TimeStep]:
        physics = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        return PhysicsState(physics=physics), _first(physics)

    def step(self, state: PhysicsState, action: Array) -> tuple[PhysicsState, TimeStep]:
        x, x_dot, theta, theta_dot = state.physics
        force = jnp.where(action == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = jnp.cos(theta), jnp.sin(theta)
        temp = (force + self.polemass_length * jnp.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * jnp.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        # Explicit Euler, gymnasium's default integrator: positions use the old velocities.
        physics = jnp.stack(
            [
                x + self.tau * x_dot,
                x_dot + self.tau * xacc,
                theta + self.tau * theta_dot,
                theta_dot + self.tau * thetaacc,
            ]
        ).astype(jnp.float32)
        x, _, theta, _ = physics
        terminated = (
            (x < -self.x_threshold)
            | (x > self.x_threshold)
            | (theta < -self.theta_threshold_radians)
            | (theta > self.theta_threshold_radians)
        )
        return PhysicsState(physics=physics), _transition(terminated, 1.0, physics)

    def _observation_high(self) -> np.ndarray:
        return np.array(
            [self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf], np.float32
        )

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(2, np.int32, name="push_left_right")


# ---------------------------------------------------------------------------------------------


def _wrap_angle(x: Array) -> Array:
    """gymnasium's `wrap(x, -pi, pi)`: add or subtract 2*pi until inside, by repeated steps
    (not a modulo, whose rounding differs). Two steps each way suffice for |x| < 5*pi, and one
    RK4 step from [-pi, pi] moves an angle by at most 9*pi*0.2 < 2*pi."""
    two_pi = 2 * math.pi
    for _ in range(2):
        x = jnp.where(x > math.pi, x - two_pi, x)
    for _ in range(2):
        x = jnp.where(x < -math.pi, x + two_pi, x)
    return x


class Acrobot(_ClassicControl):
    """Swing a two-link pendulum's tip above a line (Sutton, 1996); gymnasium's Acrobot-v1.

    Actions 0, 1, 2 apply torque -1, 0, +1 to the joint between the links. Reward -1 every
    step, 0 on the step that reaches the goal (which terminates). One RK4 step of 0.2 s per
    action, the "book" dynamics, no torque noise: gymnasium's defaults.
    """

    dt = 0.2
    link_length_1 = 1.0
    link_mass_1 = 1.0
    link_mass_2 = 1.0
    link_com_pos_1 = 0.5
    link_com_pos_2 = 0.5
    link_moi = 1.0
    max_vel_1 = 4 * math.pi
    max_vel_2 = 9 * math.pi
    torques = (-1.0, 0.0, 1.0)

    def reset(self, key: PRNGKey) -> tuple[PhysicsState, TimeStep]:
        physics = jax.random.uniform(key, (4,), jnp.float32, -0.1, 0.1)
        state = PhysicsState(physics=physics)
        return state, _first(self._observation(physics))

    @staticmethod
    def _observation(s: Array) -> Array:
        return jnp.stack(
            [jnp.cos(s[0]), jnp.sin(s[0]), jnp.cos(s[1]), jnp.sin(s[1]), s[2], s[3]]
        ).astype(jnp.float32)

    def _dsdt(self, s: Array, torque: Array) -> Array:
        m1, m2 = self.link_mass_1, self.link_mass_2
        l1, lc1, lc2 = self.link_length_1, self.link_com_pos_1, self.link_com_pos_2
        i1 = i2 = self.link_moi
        g = 9.8
        theta1, theta2, dtheta1, dtheta2 = s
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * jnp.cos(theta2)) + i1 + i2
        d2 = m2 * (lc2**2 + l1 * lc2 * jnp.cos(theta2)) + i2
        phi2 = m2 * lc2 * g * jnp.cos(theta1 + theta2 - math.pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * dtheta2**2 * jnp.sin(theta2)
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * jnp.sin(theta2)
            + (m1 * lc1 + m2 * l1) * g * jnp.cos(theta1 - math.pi / 2)
            + phi2
        )
        ddtheta2 = (
            torque + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1**2 * jnp.sin(theta2) - phi2
        ) / (m2 * lc2**2 + i2 - d2**2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return jnp.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])

    def step(self, state: PhysicsState, action: Array) -> tuple[PhysicsState, TimeStep]:
        torque = jnp.asarray(self.torques, jnp.float32)[action.astype(jnp.int32)]
        s, dt = state.physics, self.dt
        # One classical Runge-Kutta step over [0, dt], as gymnasium's `rk4`.
        k1 = self._dsdt(s, torque)
        k2 = self._dsdt(s + dt / 2 * k1, torque)
        k3 = self._dsdt(s + dt / 2 * k2, torque)
        k4 = self._dsdt(s + dt * k3, torque)
        ns = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        physics = jnp.stack(
            [
                _wrap_angle(ns[0]),
                _wrap_angle(ns[1]),
                jnp.clip(ns[2], -self.max_vel_1, self.max_vel_1),
                jnp.clip(ns[3], -self.max_vel_2, self.max_vel_2),
            ]
        ).astype(jnp.float32)
        terminated = -jnp.cos(physics[0]) - jnp.cos(physics[1] + physics[0]) > 1.0
        reward = jnp.where(terminated, 0.0, -1.0)
        observation = self._observation(physics)
        return PhysicsState(physics=physics), _transition(terminated, reward, observation)

    def _observation_high(self) -> np.ndarray:
        return np.array([1.0, 1.0, 1.0, 1.0, self.max_vel_1, self.max_vel_2], np.float32)

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(3, np.int32, name="torque_minus_zero_plus")


# ---------------------------------------------------------------------------------------------


class MountainCar(_ClassicControl):
    """Drive an under-powered car up a hill (Moore, 1990); gymnasium's MountainCar-v0.

    Actions 0, 1, 2 accelerate left, not at all, right. Reward -1 every step; the episode
    terminates when position >= 0.5 with velocity >= 0.
    """

    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    force = 0.001
    gravity = 0.0025

    def __init__(self, goal_velocity: float = 0.0):
        self.goal_velocity = goal_velocity

    def reset(self, key: PRNGKey) -> tuple[PhysicsState, TimeStep]:
        position = jax.random.uniform(key, (), jnp.float32, -0.6, -0.4)
        physics = jnp.stack([position, jnp.zeros((), jnp.float32)])
        return PhysicsState(physics=physics), _first(physics)

    def step(self, state: PhysicsState, action: Array) -> tuple[PhysicsState, TimeStep]:
        position, velocity = state.physics
        velocity = (
            velocity
            + (action.astype(jnp.float32) - 1) * self.force
            + jnp.cos(3 * position) * (-self.gravity)
        )
        velocity = jnp.clip(velocity, -self.max_speed, self.max_speed)
        position = jnp.clip(position + velocity, self.min_position, self.max_position)
        # An inelastic wall on the left.
        velocity = jnp.where(
            (position == jnp.float32(self.min_position)) & (velocity < 0), 0.0, velocity
        )
        physics = jnp.stack([position, velocity]).astype(jnp.float32)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return PhysicsState(physics=physics), _transition(terminated, -1.0, physics)

    def observation_spec(self) -> ArraySpec:
        return ArraySpec(
            (2,),
            np.float32,
            np.array([self.min_position, -self.max_speed], np.float32),
            np.array([self.max_position, self.max_speed], np.float32),
            name="position_velocity",
        )

    def action_spec(self) -> DiscreteSpec:
        return DiscreteSpec(3, np.int32, name="accelerate_left_none_right")


# ---------------------------------------------------------------------------------------------


def _angle_normalize(x: Array) -> Array:
    return ((x + math.pi) % (2 * math.pi)) - math.pi


class Pendulum(_ClassicControl):
    """Swing up and hold an inverted pendulum; gymnasium's Pendulum-v1 (continuous action).

    The action is a torque, shape [1], clipped to [-2, 2]. Reward
    -(angle^2 + 0.1 * velocity^2 + 0.001 * torque^2), from the state before the step. It never
    terminates: episodes end by the time limit only (200 steps), with discount 1.
    """

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    length = 1.0

    def __init__(self, g: float = 10.0):
        self.g = g

    def reset(self, key: PRNGKey) -> tuple[PhysicsState, TimeStep]:
        high = jnp.array([math.pi, 1.0], jnp.float32)
        physics = jax.random.uniform(key, (2,), jnp.float32, -high, high)
        return PhysicsState(physics=physics), _first(self._observation(physics))

    @staticmethod
    def _observation(physics: Array) -> Array:
        theta, theta_dot = physics
        return jnp.stack([jnp.cos(theta), jnp.sin(theta), theta_dot]).astype(jnp.float32)

    def step(self, state: PhysicsState, action: Array) -> tuple[PhysicsState, TimeStep]:
        th, thdot = state.physics
        u = jnp.clip(jnp.reshape(action, (-1,))[0], -self.max_torque, self.max_torque)
        costs = _angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        g, m, length, dt = self.g, self.m, self.length, self.dt
        newthdot = thdot + (3 * g / (2 * length) * jnp.sin(th) + 3.0 / (m * length**2) * u) * dt
        newthdot = jnp.clip(newthdot, -self.max_speed, self.max_speed)
        newth = th + newthdot * dt
        physics = jnp.stack([newth, newthdot]).astype(jnp.float32)
        timestep = _transition(jnp.zeros((), bool), -costs, self._observation(physics))
        return PhysicsState(physics=physics), timestep

    def _observation_high(self) -> np.ndarray:
        return np.array([1.0, 1.0, self.max_speed], np.float32)

    def action_spec(self) -> ArraySpec:
        return ArraySpec(
            (1,),
            np.float32,
            np.float32(-self.max_torque),
            np.float32(self.max_torque),
            name="torque",
        )
