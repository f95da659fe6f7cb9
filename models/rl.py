"""Small Keras 3 networks for reinforcement learning on vector observations."""

from __future__ import annotations

from collections.abc import Sequence

import keras


def _dense(
    units: int,
    *,
    seed: int,
    index: int,
    activation: str | None = None,
    scale: float = 1.0,
    name: str | None = None,
) -> keras.layers.Dense:
    # Explicit per-layer seeds make the initial weights a function of `seed`
    # alone, so loops built with 1 and N replicas start from the same point.
    # Orthogonal initialization with a small gain on the output layers keeps the
    # first policy near uniform and the first values near 0.
    return keras.layers.Dense(
        units,
        activation=activation,
        name=name,
        kernel_initializer=keras.initializers.Orthogonal(gain=scale, seed=seed * 1000 + index),
    )


def _tower(inputs, hidden_units: Sequence[int], *, seed: int, first_index: int, prefix: str):
    hidden = inputs
    for offset, units in enumerate(hidden_units):
        hidden = _dense(
            units,
            activation="tanh",
            scale=2**0.5,
            seed=seed,
            index=first_index + offset,
            name=f"{prefix}_hidden_{offset}",
        )(hidden)
    return hidden


def policy_value_network(
    *,
    observation_size: int,
    num_actions: int,
    hidden_units: Sequence[int] = (64, 64),
    seed: int = 0,
) -> keras.Model:
    """An actor-critic net: observations -> (action logits, state value).

    The policy and the value have separate tanh towers, so the value loss does
    not pull on the features the policy uses.

    Returns:
        A model mapping [batch, observation_size] to ([batch, num_actions], [batch]).
    """
    observations = keras.Input((observation_size,), name="observations")
    policy = _tower(observations, hidden_units, seed=seed, first_index=0, prefix="policy")
    logits = _dense(num_actions, scale=0.01, seed=seed, index=100, name="logits")(policy)
    value = _tower(observations, hidden_units, seed=seed, first_index=200, prefix="value")
    value = _dense(1, scale=1.0, seed=seed, index=300, name="value")(value)
    value = keras.layers.Reshape((), name="squeeze_value")(value)
    return keras.Model(observations, [logits, value], name="policy_value")


def q_network(
    *,
    observation_size: int,
    num_actions: int,
    hidden_units: Sequence[int] = (128, 128),
    seed: int = 0,
) -> keras.Model:
    """A Q-network: observations [batch, observation_size] -> action values [batch, num_actions]."""
    observations = keras.Input((observation_size,), name="observations")
    hidden = observations
    for index, units in enumerate(hidden_units):
        hidden = keras.layers.Dense(
            units,
            activation="relu",
            name=f"hidden_{index}",
            kernel_initializer=keras.initializers.HeUniform(seed=seed * 1000 + index),
        )(hidden)
    values = keras.layers.Dense(
        num_actions,
        name="action_values",
        kernel_initializer=keras.initializers.GlorotUniform(seed=seed * 1000 + 99),
    )(hidden)
    return keras.Model(observations, values, name="q_network")
