"""Reinforcement learning on the Loop: in-graph environment rollouts with PPO and double DQN.

The data is made by the policy itself, inside the training `tf.function`: a
train step runs `rollout_length` steps of `num_envs` batched environments
(any `loops.environments.Environment`, e.g. loops_data.cartpole.CartPole) and
then learns from them. What lives across steps (the environments, episode
statistics, a replay buffer, a target network) is held in variables created
in `build` and checkpointed with the model, so a resumed run continues the
same episodes.

How 1 and N replicas give the same numbers:
  * The state of ALL environments is mirrored on every replica. Replica r
    steps environments [r * E/R, (r + 1) * E/R) and the new states are
    gathered (`strategy.gather`) and assigned in cross-replica context.
  * Every random number of an environment (its action noise, its reset
    state, its exploration coin) is drawn for all E environments from a
    stateless seed of (seed, purpose, step, t) and the replica keeps the rows
    of its environments; so environment i sees the same numbers whichever
    replica steps it (BUILD.md fact 7: seeded Keras/TF RNG would repeat per
    replica instead).
  * Minibatches are chosen among the GLOBAL samples (the same on every
    replica); a replica computes the loss of the chosen samples it holds and
    every loss is divided by the global number of samples.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import keras
import tensorflow as tf

from loops import environments, outputs, reduction, target_networks
from loops.loop import Loop
from loops.update import Update, check_clip_norm

RETURN_WINDOW = 100  # mean_return_100 averages the returns of this many latest episodes
DEFAULT_TARGET_UPDATE_EVERY = 50  # DQN's target copy period when no target update is chosen


class Noise(enum.IntEnum):
    """What a random number is for; each purpose has its own stateless stream."""

    ENVIRONMENT = 1  # the environment's own: its start states and any randomness of a step
    ACTION = 2
    EXPLORE = 3
    SHUFFLE = 4
    REPLAY = 5
    EVALUATION = 6  # the evaluation episodes' starts and steps, the same at every evaluation


def advantages_and_returns(
    *,
    rewards: tf.Tensor,
    values: tf.Tensor,
    next_values: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    gamma: float,
    lambda_: float,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Generalized advantage estimates and the value targets (returns) they give.

    All arguments are time-major, [T, num_envs]. `next_values[t]` is the value
    of the state the action at t led to (before any reset), so an episode cut
    by the time limit is bootstrapped from its real last state, while a
    terminated one is not bootstrapped at all. No estimate reaches across the
    end of an episode. lambda_ = 1 gives the discounted returns, 0 the
    one-step TD errors.

        delta[t] = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        advantage[t] = delta[t] + gamma * lambda_ * (1 - ended[t]) * advantage[t + 1]
        return[t] = advantage[t] + values[t]

    Returns:
        (advantages, returns), each [T, num_envs] float32.
    """
    rewards = tf.convert_to_tensor(rewards, tf.float32)
    values = tf.convert_to_tensor(values, tf.float32)
    continues = 1.0 - tf.cast(terminated, tf.float32)
    ended = tf.cast(
        tf.logical_or(tf.cast(terminated, tf.bool), tf.cast(truncated, tf.bool)), tf.float32
    )
    deltas = rewards + gamma * continues * tf.convert_to_tensor(next_values, tf.float32) - values
    advantages = tf.scan(
        lambda later, inputs: inputs[0] + gamma * lambda_ * (1.0 - inputs[1]) * later,
        (deltas, ended),
        initializer=tf.zeros_like(deltas[0]),
        reverse=True,
    )
    return advantages, advantages + values


class _StateVariables(keras.layers.Layer):
    """Named non-trainable variables of a loop, mirrored and written by the first replica.

    A Keras layer, so the variables are checkpointed and listed (`.variables`)
    like a model's.
    """

    def add(self, name: str, value, dtype: str) -> keras.Variable:
        value = tf.cast(value, dtype)
        variable = self.add_weight(
            shape=tuple(value.shape),
            dtype=dtype,
            trainable=False,
            name=name,
            initializer=lambda shape, dtype=None: tf.cast(value, dtype),
            # Every replica computes (or is handed) the same value; any one copy will do.
            aggregation="only_first_replica",
        )
        # An attribute, because that is what a checkpoint of a Keras layer saves.
        setattr(self, name, variable)
        return variable


class EnvironmentLoop(Loop):
    """A Loop that steps `num_envs` copies of an in-graph environment and keeps episode statistics.

    A subclass builds its learner in `build` (after calling super().build()),
    collects data in replica context with `rollout` and hands the result to
    `record_rollout` in cross-replica context, whose episode statistics its
    train_step returns with its losses.
    """

    throughput_unit = ("env_steps", "env_steps")  # environment steps a train step takes

    needs_train_data = False
    algorithm = "rl"

    def __init__(
        self,
        *,
        environment: environments.Environment,
        num_envs: int,
        rollout_length: int,
        gamma: float = 0.99,
        eval_episodes: int = 0,
        eval_max_steps: int = 10_000,
        **loop_args,
    ):
        """
        Args:
            environment: what to step, a `loops.environments.Environment`
                (e.g. loops_data.cartpole.CartPole()).
            num_envs: environments stepped in parallel over all replicas; must
                be divisible by the replica count.
            rollout_length: steps of every environment per train step.
            gamma: discount factor in [0, 1].
            eval_episodes: episodes each evaluation plays with the greedy
                policy (`greedy_actions`), from the same seeded starts every
                time: eval metrics `mean_return`, `min_return`; 0: no
                evaluation.
            eval_max_steps: steps after which an evaluation episode that has
                not ended counts with the return it has.
            **loop_args: the `Loop` arguments (train_data is not accepted).

        Raises:
            TypeError: `environment` lacks a member of the interface (named).
            ValueError: a bad value, naming it and the fix.
        """
        environments.check_environment(environment)
        _check_whole("num_envs", num_envs)
        _check_whole("rollout_length", rollout_length)
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}; 0.99 is usual.")
        _check_whole("eval_episodes", eval_episodes, least=0, meaning=" (0: no evaluation)")
        _check_whole("eval_max_steps", eval_max_steps)
        if loop_args.get("train_data") is not None:
            raise ValueError(f"{type(self).__name__} makes its own data; do not pass train_data.")
        if loop_args.get("grad_accum_steps", 1) != 1:
            raise ValueError(
                f"{type(self).__name__} does not accumulate gradients (got grad_accum_steps="
                f"{loop_args['grad_accum_steps']!r}): its updates draw their own minibatches "
                "from the rollout or the replay buffer. Leave grad_accum_steps at 1 and set "
                "the minibatch size with global_batch_size (--global_batch_size)."
            )
        strategy = loop_args.get("strategy") or tf.distribute.get_strategy()
        replicas = strategy.num_replicas_in_sync
        if num_envs % replicas:
            raise ValueError(
                f"num_envs={num_envs} is not divisible by the {replicas} replicas; every "
                f"replica steps the same number of environments. Pass a multiple of "
                f"{replicas}, e.g. num_envs={(num_envs // replicas + 1) * replicas}."
            )
        self.environment = environment
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        self.gamma = gamma
        self.eval_episodes = eval_episodes
        self.eval_max_steps = eval_max_steps
        self._evaluate_episodes: Callable[[], tuple[tf.Tensor, tf.Tensor]] | None = None
        self.envs_per_replica = num_envs // replicas
        self.check_settings(replicas)
        super().__init__(**loop_args)

    def check_settings(self, num_replicas: int) -> None:
        """Raises ValueError for a bad setting of a subclass; runs before anything is built."""

    # ---- State. ----

    def build(self) -> None:
        start = self.environment.reset(
            tf.random.stateless_uniform(
                [self.num_envs, self.environment.noise_size], self._seed(Noise.ENVIRONMENT, -1)
            )
        )
        self.environments = _StateVariables(name="environments")
        self.observation = self.environments.add("observation", start.observation, "float32")
        self.elapsed_steps = self.environments.add("elapsed_steps", start.elapsed_steps, "int32")
        self.episode_return = self.environments.add(
            "episode_return", tf.zeros([self.num_envs]), "float32"
        )
        self.statistics = _StateVariables(name="episode_statistics")
        self.recent_returns = self.statistics.add(
            "recent_returns", tf.zeros([RETURN_WINDOW]), "float32"
        )
        self.episodes = self.statistics.add("episodes", 0, "int64")
        self.env_steps = self.statistics.add("env_steps", 0, "int64")

    def checkpoint_items(self) -> Mapping[str, object]:
        return {"environments": self.environments, "episode_statistics": self.statistics}

    # ---- Evaluation: greedy episodes. ----

    def greedy_actions(self, observation: tf.Tensor) -> tf.Tensor:
        """[n] int32: the action the trained policy takes without exploring (evaluation)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define greedy_actions(observation) to evaluate "
            "episodes (eval_episodes > 0)."
        )

    def run_evaluation(self) -> dict[str, float]:
        """Plays `eval_episodes` greedy episodes from seeded starts; their mean and least return.

        The episodes run on the host's copy of the weights, outside
        `strategy.run`, from the same starts and environment noise at every
        evaluation, so any replica count reports the same numbers.
        """
        if not self.eval_episodes:
            return {}
        if self._evaluate_episodes is None:
            self._evaluate_episodes = tf.function(self._play_greedy_episodes)
        returns, ended = (t.numpy() for t in self._evaluate_episodes())
        return {
            "mean_return": float(returns.mean()),
            "min_return": float(returns.min()),
            "episodes_ended": int(ended.sum()),
        }

    def eval_metric_names(self) -> set[str] | None:
        return {"mean_return", "min_return", "episodes_ended"} if self.eval_episodes else set()

    def _play_greedy_episodes(self) -> tuple[tf.Tensor, tf.Tensor]:
        count, noise_size = self.eval_episodes, self.environment.noise_size

        def noise(t):
            seed = self._seed(Noise.EVALUATION, t)
            return tf.random.stateless_uniform([count, noise_size], seed)

        start = self.environment.reset(noise(-1))

        def play(t, observation, elapsed, returns, ended):
            state = environments.State(observation, elapsed)
            state, transition = self.environment.step(
                state, self.greedy_actions(observation), noise(t)
            )
            live = tf.logical_not(ended)
            returns += tf.where(live, tf.cast(transition.reward, tf.float32), 0.0)
            ended = tf.logical_or(ended, tf.logical_or(transition.terminated, transition.truncated))
            return t + 1, state.observation, state.elapsed_steps, returns, ended

        def unfinished(t, observation, elapsed, returns, ended):
            return tf.logical_and(t < self.eval_max_steps, tf.logical_not(tf.reduce_all(ended)))

        _, _, _, returns, ended = tf.while_loop(
            unfinished,
            play,
            (
                tf.constant(0),
                start.observation,
                start.elapsed_steps,
                tf.zeros([count]),
                tf.zeros([count], tf.bool),
            ),
        )
        return returns, ended

    def mean_return(self) -> tf.Tensor:
        """Mean return of the last 100 finished episodes (0 before the first one ends)."""
        finished = tf.minimum(tf.convert_to_tensor(self.episodes), RETURN_WINDOW)
        return tf.math.divide_no_nan(
            tf.reduce_sum(self.recent_returns), tf.cast(finished, tf.float32)
        )

    def results_extra(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm,
            "num_envs": self.num_envs,
            "rollout_length": self.rollout_length,
            "env_steps": int(self.env_steps.numpy()),
            "episodes": int(self.episodes.numpy()),
            "mean_return_100": float(self.mean_return().numpy()),
        }

    # ---- Randomness keyed on the global environment index. ----

    def _seed(self, purpose: Noise, *data) -> tf.Tensor:
        seed = tf.constant([self.seed, int(purpose)], tf.int64)
        for value in data:
            seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(value, tf.int64))
        return seed

    def _first_env(self) -> tf.Tensor:
        """Global index of the first environment this replica steps (replica context)."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(replica, tf.int32) * self.envs_per_replica

    def own_rows(self, tensor) -> tf.Tensor:
        """This replica's environments' rows of a [num_envs, ...] tensor (replica context)."""
        tensor = tf.convert_to_tensor(tensor)
        rank = tensor.shape.rank
        # tf.slice with a constant size keeps the static shape that slicing would lose.
        return tf.slice(
            tensor,
            [self._first_env()] + [0] * (rank - 1),
            [self.envs_per_replica] + [-1] * (rank - 1),
        )

    def env_noise(self, purpose: Noise, t, shape=()) -> tf.Tensor:
        """Uniform [0, 1) noise [envs_per_replica, *shape] for this replica's environments.

        Drawn for all environments, so it depends on the global environment
        index, the step and `t`, not on the replica count (replica context).
        """
        return self.own_rows(
            tf.random.stateless_uniform(
                [self.num_envs, *shape], self._seed(purpose, self.data_step, t)
            )
        )

    # ---- Collecting. ----

    def rollout(
        self,
        act: Callable[[tf.Tensor, tf.Tensor], tuple[tf.Tensor, dict]],
        extras: Mapping[str, tf.DType] | None = None,
    ) -> dict:
        """Steps this replica's environments `rollout_length` times (replica context).

        Args:
            act: (observations [n, observation_size], t) -> (actions [n] int32, extras), where
                extras is a dict of per-environment tensors to keep per step.
            extras: name -> dtype of the extras `act` returns.

        Returns:
            A dict of time-major [T, n, ...] tensors: observation, action,
            reward, terminated and truncated (as 0/1 floats: collectives do not
            carry bools), final_observation, ended_return (the return of an
            episode that ended at t, else 0) and the extras; plus
            "next_state": this replica's environments after the rollout.
        """
        observation = self.own_rows(self.observation)
        elapsed_steps = self.own_rows(self.elapsed_steps)
        episode_return = self.own_rows(self.episode_return)
        dtypes = {
            "observation": tf.float32,
            "action": tf.int32,
            "reward": tf.float32,
            "terminated": tf.float32,
            "truncated": tf.float32,
            "final_observation": tf.float32,
            "ended_return": tf.float32,
            **(extras or {}),
        }
        arrays = {
            name: tf.TensorArray(dtype, size=self.rollout_length) for name, dtype in dtypes.items()
        }
        for t in tf.range(self.rollout_length):
            actions, step_extras = act(observation, t)
            state, transition = self.environment.step(
                environments.State(observation, elapsed_steps),
                actions,
                self.env_noise(Noise.ENVIRONMENT, t, [self.environment.noise_size]),
            )
            ended = transition.terminated | transition.truncated
            episode_return += transition.reward
            record = {
                "observation": observation,
                "action": actions,
                "reward": transition.reward,
                "final_observation": transition.final_observation,
                "terminated": tf.cast(transition.terminated, tf.float32),
                "truncated": tf.cast(transition.truncated, tf.float32),
                "ended_return": tf.where(ended, episode_return, 0.0),
                **step_extras,
            }
            arrays = {name: arrays[name].write(t, record[name]) for name in arrays}
            episode_return = tf.where(ended, 0.0, episode_return)
            observation, elapsed_steps = state.observation, state.elapsed_steps
        result = {name: array.stack() for name, array in arrays.items()}
        result["next_state"] = {
            "observation": observation,
            "elapsed_steps": elapsed_steps,
            "episode_return": episode_return,
        }
        return result

    def record_rollout(self, per_replica_rollout: dict) -> dict[str, tf.Tensor]:
        """Stores the environments' new state and the finished episodes (cross-replica).

        Returns:
            The step's episode statistics, for train_step to return:
            mean_return_100 and episodes_finished.
        """
        gathered = {
            name: self.strategy.gather(value, axis=0)
            for name, value in per_replica_rollout["next_state"].items()
        }
        self.observation.assign(gathered["observation"])
        self.elapsed_steps.assign(gathered["elapsed_steps"])
        self.episode_return.assign(gathered["episode_return"])
        rollout = self.gather_steps(
            per_replica_rollout, ("terminated", "truncated", "ended_return")
        )
        ended = (rollout["terminated"] + rollout["truncated"]) > 0
        # Row-major order (time, then environment): the same on any replica count.
        returns = tf.boolean_mask(rollout["ended_return"], ended)
        finished = tf.size(returns, out_type=tf.int64)
        kept = returns[-RETURN_WINDOW:]
        kept_count = tf.size(kept, out_type=tf.int64)
        slots = (
            tf.convert_to_tensor(self.episodes) + finished - kept_count + tf.range(kept_count)
        ) % RETURN_WINDOW
        self.recent_returns.value.scatter_update(tf.IndexedSlices(kept, slots))
        self.episodes.assign_add(finished)
        self.env_steps.assign_add(self.num_envs * self.rollout_length)
        return {
            "mean_return_100": outputs.Last(self.mean_return()),
            "episodes_finished": outputs.Sum(finished),
            "env_steps": outputs.Sum(tf.constant(self.num_envs * self.rollout_length, tf.int64)),
        }

    def gather_steps(self, per_replica_rollout: dict, names) -> dict[str, tf.Tensor]:
        """The rollout entries `names` of all replicas, [T, num_envs, ...] (cross-replica)."""
        return {name: self.strategy.gather(per_replica_rollout[name], axis=1) for name in names}


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
        # PPO.
        gae_lambda: float = 0.95,
        epochs: int = 4,
        global_batch_size: int = 256,
        clip_ratio: float = 0.2,
        value_coefficient: float = 0.5,
        entropy_coefficient: float = 0.01,
        clip_norm: float | None = 0.5,
        **loop_args,
    ):
        """
        Args:
            environment: what to step, a `loops.environments.Environment`.
            model_fn: builds the policy/value model (called in scope), mapping
                observations [batch, observation_size] to (logits [batch,
                num_actions], value [batch]), e.g.
                loops_models.rl.policy_value_network; seed its initializers
                so that runs on any replica count start from the same weights.
            optimizer_fn: builds the optimizer (in scope); default Adam(1e-3).
            num_envs, rollout_length, gamma: see EnvironmentLoop.
            gae_lambda: the GAE lambda in [0, 1].
            epochs: passes over each rollout.
            global_batch_size: samples per minibatch over all replicas; must
                divide num_envs * rollout_length.
            clip_ratio: PPO's probability-ratio clip epsilon (> 0).
            value_coefficient, entropy_coefficient: weights of the value loss
                and of the entropy bonus.
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            **loop_args: the `Loop` arguments.

        Raises:
            TypeError: `environment` lacks a member of the interface, or
                `model_fn` is not callable.
            ValueError: a bad setting, naming it and the fix.
        """
        self.model_fn = _checked_model_fn(model_fn)
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
            **loop_args,
        )

    def check_settings(self, num_replicas: int) -> None:
        _check_whole("epochs", self.epochs)
        _check_whole("global_batch_size", self.global_batch_size)
        samples = self.num_envs * self.rollout_length
        if samples % self.global_batch_size:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} does not divide the "
                f"{samples} samples of a rollout (num_envs={self.num_envs} x "
                f"rollout_length={self.rollout_length}); pass a divisor, e.g. "
                f"{_largest_divisor(samples, self.global_batch_size)}."
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
        self.model = self.model_fn()
        self.optimizer = self.optimizer_fn()
        # Built here, in scope: built lazily inside strategy.run it fails (BUILD.md fact 1).
        self.optimizer.build(self.model.trainable_variables)
        self.update = Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)

    def checkpoint_items(self):
        return {
            **super().checkpoint_items(),
            "model": self.model,
            "optimizer": self.optimizer,
        }

    def greedy_actions(self, observation: tf.Tensor) -> tf.Tensor:
        logits, _ = _float32(self.model(observation))
        return tf.argmax(logits, axis=-1, output_type=tf.int32)

    def _act(self, observation, t):
        logits, value = _float32(self.model(observation))
        # Gumbel-max sampling with this environment's own noise.
        noise = self.env_noise(Noise.ACTION, t, [self.environment.num_actions])
        gumbel = -tf.math.log(-tf.math.log(tf.clip_by_value(noise, 1e-12, 1.0 - 1e-7)))
        actions = tf.argmax(logits + gumbel, axis=-1, output_type=tf.int32)
        log_probability = tf.gather(tf.nn.log_softmax(logits), actions, batch_dims=1)
        return actions, {"value": value, "log_probability": log_probability}

    def _replica_collect(self):
        rollout = self.rollout(self._act, {"value": tf.float32, "log_probability": tf.float32})
        _, next_values = _float32(
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
        logits, values = _float32(self.model(batch["observation"], training=True))
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
        totals = {name: tf.constant(0.0) for name in ("policy_loss", "value_loss", "entropy")}
        loss_scale = _loss_scale_value(self.update)
        nonfinite, overflows = tf.constant(0.0), tf.constant(0.0)
        for update in tf.range(updates):
            result = self.update(self._replica_loss, args=(collected["samples"], update))
            totals = {name: totals[name] + result.sums[name] for name in totals}
            nonfinite = tf.maximum(nonfinite, result.nonfinite)
            overflows += result.overflow
        return {
            **{name: outputs.Mean(value / updates) for name, value in totals.items()},
            **_update_flags(nonfinite, overflows, loss_scale),
            **statistics,
        }


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
        **loop_args,
    ):
        """
        Args:
            environment: what to step, a `loops.environments.Environment`.
            model_fn: builds a Q-network (called twice in scope: online and
                target), observations [batch, observation_size] -> [batch,
                num_actions], e.g. loops_models.rl.q_network; seed its
                initializers so that runs on any replica count start from the
                same weights.
            optimizer_fn: builds the optimizer (in scope); default Adam(1e-3).
            num_envs, rollout_length, gamma: see EnvironmentLoop.
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
            **loop_args: the `Loop` arguments.

        Raises:
            TypeError: `environment` lacks a member of the interface, or
                `model_fn` is not callable.
            ValueError: a bad setting, naming it and the fix.
        """
        self.model_fn = _checked_model_fn(model_fn)
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
            **loop_args,
        )

    def check_settings(self, num_replicas: int) -> None:
        for name in (
            "buffer_capacity",
            "global_batch_size",
            "updates_per_step",
            "exploration_steps",
        ):
            _check_whole(name, getattr(self, name))
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
            _check_whole("target_update_every", self.target_update_every)
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

        self.model = self.model_fn()
        self.target = self.model_fn()
        target_networks.copy(self.target, self.model)
        self.optimizer = self.optimizer_fn()
        self.optimizer.build(self.model.trainable_variables)
        self.update = Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)
        capacity, size = self.buffer_capacity, self.environment.observation_size
        self.replay = _StateVariables(name="replay_buffer")
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
        return tf.argmax(_float32(self.model(observation)), axis=-1, output_type=tf.int32)

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
            _float32(self.model(batch["final_observation"])), axis=-1, output_type=tf.int32
        )
        next_value = tf.gather(
            _float32(self.target(batch["final_observation"])), next_action, batch_dims=1
        )
        target = tf.stop_gradient(
            batch["reward"] + self.gamma * (1.0 - batch["terminated"]) * next_value
        )
        q_values = tf.gather(
            _float32(self.model(batch["observation"], training=True)),
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
        totals = {name: tf.constant(0.0) for name in ("loss", "q_value")}
        loss_scale = _loss_scale_value(self.update)
        nonfinite, overflows = tf.constant(0.0), tf.constant(0.0)
        for update in tf.range(updates):
            result = self.update(self._replica_loss, args=(update,))
            totals = {name: totals[name] + result.sums[name] for name in totals}
            nonfinite = tf.maximum(nonfinite, result.nonfinite)
            overflows += result.overflow
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
            **_update_flags(nonfinite, overflows, loss_scale),
            **statistics,
        }


def _env_major(value: tf.Tensor) -> tf.Tensor:
    """[T, n, ...] -> [n, T, ...]."""
    return tf.transpose(value, [1, 0, *range(2, value.shape.rank)])


def _largest_divisor(number: int, at_most: int) -> int:
    return max(d for d in range(1, min(number, at_most) + 1) if number % d == 0)


def _checked_model_fn(model_fn):
    if not callable(model_fn):
        raise TypeError(
            f"model_fn must be a function of no arguments that builds the network, got "
            f"{model_fn!r}; pass e.g. model_fn=lambda: my_network(seed=0)."
        )
    return model_fn


def _check_whole(name: str, value, *, least: int = 1, meaning: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}{meaning}, got {value!r}.")


def _loss_scale_value(update: Update) -> tf.Tensor | None:
    """The loss scale a step begins with; None without one."""
    return None if update.loss_scale is None else update.loss_scale.scale.read_value()


def _update_flags(nonfinite, overflows, loss_scale) -> dict[str, outputs.Output]:
    """The step outputs of its updates: any not finite, and the loss scale's overflows."""
    flags: dict[str, outputs.Output] = {
        outputs.NONFINITE: outputs.Sum(tf.cast(nonfinite, tf.int32))
    }
    if loss_scale is not None:
        flags["loss_scale"] = outputs.Last(loss_scale)
        flags["overflow"] = outputs.Sum(tf.cast(overflows, tf.int32))
    return flags


def _float32(model_outputs):
    """A model's outputs in float32: losses and sampling stay float32 under mixed precision."""
    return tf.nest.map_structure(lambda output: tf.cast(output, tf.float32), model_outputs)
