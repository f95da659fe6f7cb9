"""PPO with GAE on the environment loop: ActorCriticLoop."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from loops.core import outputs, reduction
from loops.core.update import check_clip_norm
from loops.input import environments
from loops.kinds.rl.advantages import advantages_and_returns
from loops.kinds.rl.checks import checked_model_fn, largest_divisor
from loops.kinds.rl.environment_loop import EnvironmentLoop
from loops.kinds.rl.model_outputs import float32
from loops.kinds.rl.noise import Noise
from loops.kinds.rl.updates import run_updates
from loops.vocabulary.whole_numbers import check_whole


class ActorCriticLoop(EnvironmentLoop):
    """PPO with GAE: collect a rollout, then several epochs of minibatch updates.

    Each train step collects num_envs * rollout_length transitions with the
    current policy, estimates advantages (bootstrapping at truncation, not at
    termination), normalizes them over the whole rollout, and runs `epochs`
    passes over the rollout in minibatches of `global_batch_size`, minimizing
    the clipped surrogate, value and entropy terms, each a sum over the
    minibatch divided by the global minibatch size. With epochs=1 and
    global_batch_size = num_envs * rollout_length the ratio is 1, the clip
    never acts, and it is A2C with GAE (and normalized advantages).

    Args:
        environment: what to step, a `loops.environments.Environment`.
        model_fn: builds the policy/value model (called in scope), mapping
            observations [batch, observation_size] to (logits [batch,
            num_actions], value [batch]), e.g.
            loops_models.rl.policy_value_network; seed its initializers
            so that runs on any replica count start from the same weights.
        optimizer_fn: builds the optimizer (in scope); default Adam(1e-3).
        num_envs, rollout_length, gamma, eval_episodes, eval_max_steps: see
            EnvironmentLoop.
        gae_lambda: the GAE lambda in [0, 1].
        epochs: passes over each rollout.
        global_batch_size: samples per minibatch over all replicas; must
            divide num_envs * rollout_length.
        clip_ratio: PPO's probability-ratio clip epsilon (> 0).
        value_coefficient, entropy_coefficient: weights of the value loss
            and of the entropy bonus.
        clip_norm: clip the summed gradient to this global norm; None: no clip.

    Raises:
        TypeError: `environment` lacks a member of the interface, or
            `model_fn` is not callable.
        ValueError: a bad setting, naming it and the fix.
    """

    name = "rl"
    algorithm = "ppo"

    def __init__(
        self,
        *,
        environment: environments.Environment,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        # Environments.
        num_envs: int = 16,
        rollout_length: int = 64,
        gamma: float = 0.99,
        eval_episodes: int = 0,
        eval_max_steps: int = 10_000,
        # PPO.
        gae_lambda: float = 0.95,
        epochs: int = 4,
        global_batch_size: int = 256,
        clip_ratio: float = 0.2,
        value_coefficient: float = 0.5,
        entropy_coefficient: float = 0.01,
        clip_norm: float | None = 0.5,
    ):
        self.model_fn = checked_model_fn(model_fn)
        self.optimizer_fn = optimizer_fn or (lambda: keras.optimizers.Adam(1e-3))
        self.gae_lambda = gae_lambda
        self.epochs = epochs
        self.global_batch_size = global_batch_size
        self.clip_ratio = clip_ratio
        self.value_coefficient = value_coefficient
        self.entropy_coefficient = entropy_coefficient
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
        check_whole("epochs", self.epochs)
        check_whole("global_batch_size", self.global_batch_size)
        samples = self.num_envs * self.rollout_length
        if samples % self.global_batch_size:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} does not divide the "
                f"{samples} samples of a rollout (num_envs={self.num_envs} x "
                f"rollout_length={self.rollout_length}); pass a divisor, e.g. "
                f"{largest_divisor(samples, self.global_batch_size)}."
            )
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(
                f"gae_lambda must be in [0, 1], got {self.gae_lambda!r}; 0.95 is usual."
            )
        if not self.clip_ratio > 0:
            raise ValueError(f"clip_ratio must be > 0, got {self.clip_ratio!r}; 0.2 is usual.")
        check_clip_norm(self.clip_norm)

    @property
    def minibatches(self) -> int:
        """Minibatches per epoch."""
        return self.num_envs * self.rollout_length // self.global_batch_size

    def build(self) -> None:
        super().build()
        self.build_one_update(self.model_fn(), self.optimizer_fn, clip_norm=self.clip_norm)

    def checkpoint_items(self):
        return {**super().checkpoint_items(), **self.one_update_checkpoint_items()}

    def greedy_actions(self, observation: tf.Tensor) -> tf.Tensor:
        logits, _ = float32(self.model(observation))
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def _act(self, observation, t):
        logits, value = float32(self.model(observation))
        # Gumbel-max sampling with this environment's own noise.
        noise = self.env_noise(Noise.ACTION, t, [self.environment.num_actions])
        gumbel = -tf.math.log(-tf.math.log(tf.clip_by_value(noise, 1e-12, 1.0 - 1e-7)))
        actions = tf.argmax(logits + gumbel, axis=-1, output_type=tf.int32)
        log_probability = tf.gather(tf.nn.log_softmax(logits), actions, batch_dims=1)
        return actions, {"value": value, "log_probability": log_probability}

    def _replica_collect(self):
        rollout = self.rollout(self._act, {"value": tf.float32, "log_probability": tf.float32})
        _, next_values = float32(
            self.model(
                tf.reshape(rollout["final_observation"], [-1, self.environment.observation_size])
            )
        )
        advantages, returns = advantages_and_returns(
            rewards=rollout["reward"],
            values=rollout["value"],
            next_values=tf.reshape(next_values, tf.shape(rollout["reward"])),
            terminated=rollout["terminated"],
            truncated=rollout["truncated"],
            gamma=self.gamma,
            lambda_=self.gae_lambda,
        )
        # Normalized with the mean and deviation over ALL replicas' samples.
        count = float(self.num_envs * self.rollout_length)
        total, squares = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, [tf.reduce_sum(advantages), tf.reduce_sum(advantages**2)]
        )
        mean = total / count
        deviation = tf.sqrt(tf.maximum(squares / count - mean**2, 0.0))
        # Environment-major samples: global sample id = env * T + t.
        samples = {
            "observation": rollout["observation"],
            "action": rollout["action"],
            "log_probability": rollout["log_probability"],
            "return": returns,
            "advantage": (advantages - mean) / (deviation + 1e-8),
        }
        samples = {
            name: tf.reshape(_env_major(value), [-1, *value.shape[2:]])
            for name, value in samples.items()
        }
        return {**rollout, "samples": samples}

    def _replica_loss(self, samples, update):
        epoch = update // self.minibatches
        order = tf.random.experimental.stateless_shuffle(
            tf.range(self.num_envs * self.rollout_length),
            self._seed(Noise.SHUFFLE, self.data_step, epoch),
        )
        position = (update % self.minibatches) * self.global_batch_size
        chosen = order[position : position + self.global_batch_size]
        # This replica's samples among the chosen ones.
        first = self._first_env() * self.rollout_length
        local = chosen - first
        held = self.envs_per_replica * self.rollout_length
        local = tf.boolean_mask(local, (local >= 0) & (local < held))
        batch = {name: tf.gather(value, local) for name, value in samples.items()}
        count = tf.constant(float(self.global_batch_size))
        logits, values = float32(self.model(batch["observation"], training=True))
        log_probabilities = tf.nn.log_softmax(logits)
        log_probability = tf.gather(log_probabilities, batch["action"], batch_dims=1)
        ratio = tf.exp(log_probability - batch["log_probability"])
        advantage = batch["advantage"]
        surrogate = tf.minimum(
            ratio * advantage,
            tf.clip_by_value(ratio, 1.0 - self.clip_ratio, 1.0 + self.clip_ratio) * advantage,
        )
        policy_loss = reduction.scale_to_global_batch(-surrogate, count)
        value_loss = reduction.scale_to_global_batch(
            0.5 * tf.square(values - batch["return"]), count
        )
        entropy = reduction.scale_to_global_batch(
            -tf.reduce_sum(tf.exp(log_probabilities) * log_probabilities, axis=-1), count
        )
        loss = (
            policy_loss + self.value_coefficient * value_loss - self.entropy_coefficient * entropy
        )
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}

    def train_step(self, iterator):
        collected = self.strategy.run(self._replica_collect)
        statistics = self.record_rollout(collected)
        updates = self.epochs * self.minibatches
        totals, flags = run_updates(
            self.update,
            self._replica_loss,
            count=updates,
            args=lambda update: (collected["samples"], update),
            names=("policy_loss", "value_loss", "entropy"),
        )
        return {
            **{name: outputs.Mean(value / updates) for name, value in totals.items()},
            **flags,
            **statistics,
        }


def _env_major(value: tf.Tensor) -> tf.Tensor:
    """[T, n, ...] -> [n, T, ...]."""
    return tf.transpose(value, [1, 0, *range(2, value.shape.rank)])
