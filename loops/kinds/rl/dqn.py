"""Double DQN on the environment loop, with a shared replay buffer and a target network: DQNLoop."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from loops.core import outputs, reduction, target_networks
from loops.core.update import check_clip_norm
from loops.input import environments
from loops.kinds.rl.checks import checked_model_fn
from loops.kinds.rl.environment_loop import EnvironmentLoop
from loops.kinds.rl.model_outputs import float32
from loops.kinds.rl.noise import Noise
from loops.kinds.rl.state_variables import StateVariables
from loops.kinds.rl.updates import run_updates
from loops.vocabulary.whole_numbers import check_whole

DEFAULT_TARGET_UPDATE_EVERY = 50  # DQN's target copy period when no target update is chosen


class DQNLoop(EnvironmentLoop):
    """Double DQN on an in-graph environment with a replay buffer and a target network.

    Each train step collects rollout_length steps of every environment with
    an epsilon-greedy policy, appends them to the replay buffer, makes
    `updates_per_step` gradient updates on minibatches of `global_batch_size`
    transitions sampled uniformly from the buffer (once it holds
    `learning_starts`), and then updates the target network: a copy every
    `target_update_every` train steps, or a soft update with `target_tau`.

    The replay buffer is SHARED: every replica holds all of it, written in
    cross-replica context with the gathered transitions of all environments
    in (time, global environment) order, and a replica trains on its share of
    a minibatch drawn from the whole buffer. That keeps 1 and N replicas
    exactly equal and sampling uniform over all experience, at the price of
    R copies of the buffer and an all-gather of each rollout: right for small
    observations like CartPole's; large observations would want a buffer
    sharded per replica.

    Args:
        environment: what to step, a `loops.environments.Environment`.
        model_fn: builds a Q-network (called twice in scope: online and
            target), observations [batch, observation_size] -> [batch,
            num_actions], e.g. loops_models.rl.q_network; seed its
            initializers so that runs on any replica count start from the
            same weights.
        optimizer_fn: builds the optimizer (in scope); default Adam(1e-3).
        num_envs, rollout_length, gamma, eval_episodes, eval_max_steps: see
            EnvironmentLoop.
        buffer_capacity: transitions the replay buffer keeps (oldest
            overwritten); at least num_envs * rollout_length.
        global_batch_size: transitions per update over all replicas;
            divisible by the replica count.
        learning_starts: transitions collected before the first update.
        updates_per_step: gradient updates per train step.
        epsilon_start, epsilon_end, exploration_steps: the epsilon-greedy
            schedule, linear in environment steps.
        target_update_every: copy the online weights into the target
            every this many train steps (50 when neither this nor
            target_tau is given).
        target_tau: instead, move the target by this fraction each step.
        clip_norm: clip the summed gradient to this global norm; None: no clip.

    Raises:
        TypeError: `environment` lacks a member of the interface, or
            `model_fn` is not callable.
        ValueError: a bad setting, naming it and the fix.
    """

    name = "rl"
    algorithm = "dqn"

    def __init__(
        self,
        *,
        environment: environments.Environment,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        # Environments.
        num_envs: int = 8,
        rollout_length: int = 4,
        gamma: float = 0.99,
        eval_episodes: int = 0,
        eval_max_steps: int = 10_000,
        # Replay.
        buffer_capacity: int = 50_000,
        global_batch_size: int = 128,
        learning_starts: int = 1_000,
        updates_per_step: int = 2,
        # Exploration: epsilon falls linearly over `exploration_steps` env steps.
        epsilon_start: float = 1.0,
        epsilon_end: float = 0.05,
        exploration_steps: int = 10_000,
        # Target network: at most one of the two.
        target_update_every: int | None = None,
        target_tau: float | None = None,
        clip_norm: float | None = 10.0,
    ):
        self.model_fn = checked_model_fn(model_fn)
        self.optimizer_fn = optimizer_fn or (lambda: keras.optimizers.Adam(1e-3))
        self.buffer_capacity = buffer_capacity
        self.global_batch_size = global_batch_size
        self.learning_starts = learning_starts
        self.updates_per_step = updates_per_step
        self.epsilon_start = epsilon_start
        self.epsilon_end = epsilon_end
        self.exploration_steps = exploration_steps
        self.target_update_every = target_update_every
        if target_update_every is None and target_tau is None:
            self.target_update_every = DEFAULT_TARGET_UPDATE_EVERY
        self.target_tau = target_tau
        self.clip_norm = clip_norm
        super().__init__(
            environment=environment,
            num_envs=num_envs,
            rollout_length=rollout_length,
            gamma=gamma,
            eval_episodes=eval_episodes,
            eval_max_steps=eval_max_steps,
        )

    def check_settings(self, num_replicas: int) -> None:
        for name in (
            "buffer_capacity",
            "global_batch_size",
            "updates_per_step",
            "exploration_steps",
        ):
            check_whole(name, getattr(self, name))
        if self.learning_starts < 0:
            raise ValueError(f"learning_starts must be >= 0, got {self.learning_starts!r}.")
        rollout = self.num_envs * self.rollout_length
        if self.buffer_capacity < rollout:
            raise ValueError(
                f"buffer_capacity={self.buffer_capacity} cannot hold one rollout of "
                f"num_envs * rollout_length = {rollout} transitions; raise "
                "buffer_capacity or shorten the rollout."
            )
        if not 0 <= self.epsilon_end <= self.epsilon_start <= 1:
            raise ValueError(
                f"need 0 <= epsilon_end <= epsilon_start <= 1, got epsilon_start="
                f"{self.epsilon_start!r}, epsilon_end={self.epsilon_end!r}."
            )
        if self.target_update_every is not None and self.target_tau is not None:
            raise ValueError(
                "Pass one of target_update_every (hard copy every K steps) and target_tau "
                f"(soft update), not both; got target_update_every={self.target_update_every!r}, "
                f"target_tau={self.target_tau!r}."
            )
        if self.target_update_every is not None:
            check_whole("target_update_every", self.target_update_every)
        if self.target_tau is not None and not 0 < self.target_tau <= 1:
            raise ValueError(
                f"target_tau must be in (0, 1], got {self.target_tau!r}; 0.005 is usual."
            )
        check_clip_norm(self.clip_norm)
        if self.global_batch_size % num_replicas:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} is not divisible by the "
                f"{num_replicas} replicas; pass a multiple of {num_replicas}."
            )

    def build(self) -> None:
        super().build()
        self.build_one_update(self.model_fn(), self.optimizer_fn, clip_norm=self.clip_norm)
        self.target = self.model_fn()
        target_networks.copy(self.target, self.model)
        capacity, size = self.buffer_capacity, self.environment.observation_size
        self.replay = StateVariables(name="replay_buffer")
        self.replay_columns = {
            "observation": self.replay.add("observation", tf.zeros([capacity, size]), "float32"),
            "action": self.replay.add("action", tf.zeros([capacity]), "int32"),
            "reward": self.replay.add("reward", tf.zeros([capacity]), "float32"),
            "terminated": self.replay.add("terminated", tf.zeros([capacity]), "float32"),
            "final_observation": self.replay.add(
                "final_observation", tf.zeros([capacity, size]), "float32"
            ),
        }
        self.replay_size = self.replay.add("size", 0, "int64")
        self.replay_next = self.replay.add("next_slot", 0, "int64")

    def checkpoint_items(self):
        return {
            **super().checkpoint_items(),
            "model": self.model,
            "target": self.target,
            "optimizer": self.optimizer,
            "replay_buffer": self.replay,
        }

    def epsilon(self) -> tf.Tensor:
        """The exploration rate of the current step."""
        progress = tf.minimum(
            tf.cast(self.global_step * self.num_envs * self.rollout_length, tf.float32)
            / self.exploration_steps,
            1.0,
        )
        return self.epsilon_start + (self.epsilon_end - self.epsilon_start) * progress

    def greedy_actions(self, observation: tf.Tensor) -> tf.Tensor:
        return tf.argmax(float32(self.model(observation)), axis=-1, output_type=tf.int32)

    def _act(self, observation, t):
        greedy = self.greedy_actions(observation)
        coin, pick = tf.unstack(self.env_noise(Noise.EXPLORE, t, [2]), axis=-1)
        num_actions = self.environment.num_actions
        random = tf.minimum(tf.cast(pick * num_actions, tf.int32), num_actions - 1)
        return tf.where(coin < self.epsilon(), random, greedy), {}

    def _store(self, rollout) -> None:
        """Appends a gathered rollout to the replay buffer (cross-replica context)."""
        count = self.num_envs * self.rollout_length
        slots = (
            tf.convert_to_tensor(self.replay_next) + tf.range(count, dtype=tf.int64)
        ) % self.buffer_capacity
        for name, variable in self.replay_columns.items():
            value = tf.cast(rollout[name], variable.dtype)
            value = tf.reshape(value, [count, *variable.shape[1:]])
            variable.value.scatter_update(tf.IndexedSlices(value, slots))
        self.replay_next.assign(
            (tf.convert_to_tensor(self.replay_next) + count) % self.buffer_capacity
        )
        self.replay_size.assign(
            tf.minimum(tf.convert_to_tensor(self.replay_size) + count, self.buffer_capacity)
        )

    def _replica_loss(self, update):
        indices = tf.random.stateless_uniform(
            [self.global_batch_size],
            self._seed(Noise.REPLAY, self.data_step, update),
            minval=0,
            maxval=tf.convert_to_tensor(self.replay_size),
            dtype=tf.int64,
        )
        context = tf.distribute.get_replica_context()
        share = self.global_batch_size // context.num_replicas_in_sync
        indices = tf.slice(indices, [context.replica_id_in_sync_group * share], [share])
        batch = {
            name: tf.gather(variable, indices) for name, variable in self.replay_columns.items()
        }
        # Double DQN: the online net picks the next action, the target net values it.
        next_action = tf.argmax(
            float32(self.model(batch["final_observation"])), axis=-1, output_type=tf.int32
        )
        next_value = tf.gather(
            float32(self.target(batch["final_observation"])), next_action, batch_dims=1
        )
        target = tf.stop_gradient(
            batch["reward"] + self.gamma * (1.0 - batch["terminated"]) * next_value
        )
        q_values = tf.gather(
            float32(self.model(batch["observation"], training=True)),
            batch["action"],
            batch_dims=1,
        )
        error = q_values - target
        # Huber loss with delta 1.
        per_sample = tf.where(tf.abs(error) < 1.0, 0.5 * tf.square(error), tf.abs(error) - 0.5)
        loss = reduction.scale_to_global_batch(per_sample, float(self.global_batch_size))
        return loss, {
            "q_value": reduction.scale_to_global_batch(q_values, float(self.global_batch_size))
        }

    def train_step(self, iterator):
        rollout = self.strategy.run(lambda: self.rollout(self._act))
        statistics = self.record_rollout(rollout)
        self._store(self.gather_steps(rollout, self.replay_columns))
        # No update until the buffer holds learning_starts transitions: a loop
        # of zero updates, which needs no branch around the collectives.
        ready = tf.convert_to_tensor(self.replay_size) >= self.learning_starts
        updates = tf.where(ready, self.updates_per_step, 0)
        totals, flags = run_updates(
            self.update,
            self._replica_loss,
            count=updates,
            args=lambda update: (update,),
            names=("loss", "q_value"),
        )
        if self.target_tau is None:
            assert self.target_update_every is not None  # set whenever target_tau is None
            target_networks.copy_every(
                self.target, self.model, step=self.global_step + 1, every=self.target_update_every
            )
        else:
            target_networks.soft_update(self.target, self.model, tau=self.target_tau)
        done = tf.cast(tf.maximum(updates, 1), tf.float32)
        return {
            **{name: outputs.Mean(value / done) for name, value in totals.items()},
            "epsilon": outputs.Last(self.epsilon()),
            **flags,
            **statistics,
        }
