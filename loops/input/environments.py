"""The interface of the in-graph environments the RL loops step (`loops.kinds.rl`).

An environment is a batch of independent copies of one task written in
TensorFlow ops, so that a whole rollout runs inside the training
`tf.function`. The loops hold the state of every copy in variables and call
the environment with the rows of the copies one replica steps; the
environment itself keeps nothing between calls.

Any object with the attributes and methods of `Environment` will do (a class
instance, or a module); it need not inherit from it. `loops_data.cartpole`
(CartPole-v1) is one. What a method must do:

  * In-graph: only TensorFlow ops on the tensors it is given. It is traced
    inside a `tf.function` in replica context, so no NumPy on tensors, no
    Python branching on tensor values, no Python state changed per call.
  * Per environment: row i of every output depends only on row i of the
    inputs. A replica steps a slice of the environments, so the batch size
    `n` is not fixed (do not hard-code it) and no op may mix rows.
  * Keyed noise: all randomness comes from the `uniform_noise` argument
    (uniform in [0, 1), [n, noise_size]), never from `tf.random` ops of its
    own. The loops draw that noise for ALL environments from a stateless seed
    of (seed, step, t) and hand each replica its rows, so environment i gets
    the same numbers whichever replica steps it, and 1 and N replicas give the
    same trajectories.
  * Markov in what the loop keeps: the loop stores only `State` (the
    observation and the step count within the episode), so everything the
    next step depends on must be in those.

`check_environment` raises a TypeError naming what an object lacks; the
loops call it in their constructors, before anything is built.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple, Protocol, runtime_checkable

import tensorflow as tf


class State(NamedTuple):
    """The state of a batch of n environments, all the loop keeps between steps.

    observation: [n, observation_size] float32, what the agent sees.
    elapsed_steps: [n] int32, steps taken in the current episode (0 after a reset).
    """

    observation: tf.Tensor
    elapsed_steps: tf.Tensor


class Transition(NamedTuple):
    """What one step of a batch of n environments produced.

    reward: [n] float32, the reward of the action taken.
    terminated: [n] bool, the episode reached a true end: nothing follows,
        so the learners take the value of what comes after as 0.
    truncated: [n] bool, the episode was cut (e.g. by a time limit): the
        learners bootstrap from the value of `final_observation`, unless
        `terminated` is also set.
    final_observation: [n, observation_size] float32, the observation the
        action led to, before an episode that ended was reset.
    """

    reward: tf.Tensor
    terminated: tf.Tensor
    truncated: tf.Tensor
    final_observation: tf.Tensor


@runtime_checkable
class Environment(Protocol):
    """A batch of copies of one task with vector observations and discrete actions.

    Attributes:
        observation_size: the length of one observation vector.
        num_actions: actions are the integers 0 .. num_actions - 1.
        noise_size: uniform numbers one environment needs per reset or step
            (0 for a deterministic environment).
    """

    observation_size: int
    num_actions: int
    noise_size: int

    def reset(self, uniform_noise: tf.Tensor) -> State:
        """Fresh episodes.

        Args:
            uniform_noise: [n, noise_size] float32 in [0, 1), the only
                randomness the start states may depend on.

        Returns:
            The start State of n environments, with elapsed_steps 0.
        """
        ...

    def step(
        self, state: State, actions: tf.Tensor, uniform_noise: tf.Tensor
    ) -> tuple[State, Transition]:
        """Steps every environment once and resets those whose episode ended.

        Args:
            state: the State of n environments.
            actions: [n] int32 in [0, num_actions).
            uniform_noise: [n, noise_size] float32 in [0, 1), the only
                randomness of the step and of any reset it makes.

        Returns:
            (next State, in which an environment whose episode ended (terminated
            or truncated) has already been reset; the step's Transition).
        """
        ...


SIZE_ATTRIBUTES = {"observation_size": 1, "num_actions": 1, "noise_size": 0}  # name -> least value
METHODS = ("reset", "step")


def check_environment(environment: object) -> None:
    """Checks that `environment` has what `Environment` asks for, before it is used.

    Only the presence of the members and the sizes are checked; what the
    methods compute shows when a loop traces them.

    Raises:
        TypeError: a member is missing, a method is not callable, or a size is
            not a whole number; the message names them.
        ValueError: a size is below its least value (1, or 0 for noise_size).
    """
    missing = [name for name in (*SIZE_ATTRIBUTES, *METHODS) if not hasattr(environment, name)]
    not_callable = [
        name
        for name in METHODS
        if hasattr(environment, name) and not callable(getattr(environment, name))
    ]
    if missing or not_callable:
        problems = []
        if missing:
            problems.append(f"it has no {', '.join(missing)}")
        if not_callable:
            problems.append(f"{', '.join(not_callable)} is not callable")
        raise TypeError(
            f"{environment!r} is not an environment: {'; '.join(problems)}. An environment "
            "needs the whole numbers observation_size, num_actions and noise_size and the "
            "methods reset(uniform_noise) and step(state, actions, uniform_noise); see "
            "loops.environments.Environment."
        )
    for name, least in SIZE_ATTRIBUTES.items():
        value = getattr(environment, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} of {environment!r} must be a whole number, got {value!r}.")
        if value < least:
            raise ValueError(f"{name} of {environment!r} must be >= {least}, got {value!r}.")
