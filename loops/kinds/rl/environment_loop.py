"""The Loop every RL kind builds on: environments stepped in-graph, episode statistics, evaluation.

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

from collections.abc import Callable, Mapping

import tensorflow as tf

from loops.core import outputs
from loops.definition.loop import Loop, RunContext, StepOptions
from loops.input import environments
from loops.kinds.rl.episode_statistics import EpisodeStatistics
from loops.kinds.rl.greedy_episodes import play_greedy_episodes
from loops.kinds.rl.noise import Noise, stateless_seed
from loops.kinds.rl.state_variables import StateVariables
from loops.vocabulary.whole_numbers import check_whole

# What `rollout` keeps of every step, besides the extras of the policy.
ROLLOUT_DTYPES = {
    "observation": tf.float32,
    "action": tf.int32,
    "reward": tf.float32,
    "terminated": tf.float32,
    "truncated": tf.float32,
    "final_observation": tf.float32,
    "ended_return": tf.float32,
}


class EnvironmentLoop(Loop):
    """A Loop that steps `num_envs` copies of an in-graph environment and keeps episode statistics.

    A subclass builds its learner in `build` (after calling super().build()),
    collects data in replica context with `rollout` and hands the result to
    `record_rollout` in cross-replica context, whose episode statistics its
    train_step returns with its losses.

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

    The Trainer it is handed refuses train_data, grad_accum_steps > 1 and a
    replica count that does not divide num_envs (`check_can_train`).

    Raises:
        TypeError: `environment` lacks a member of the interface (named).
        ValueError: a bad value, naming it and the fix.
    """

    throughput_unit = ("env_steps", "env_steps")  # environment steps a train step takes
    # None: on_loss_spike is refused. An RL loss grows with the returns it learns
    # (larger value targets), so its ratio to a moving average is no sign of divergence.
    watched_loss: str | None = None
    parameter_server_reason = (
        "an RL loop makes its own data: each step moves its environments, whose state every "
        "replica holds and writes in the step, and a parameter-server worker's part of a step "
        "cannot write it (exact mode: it only computes gradients; async mode: each worker "
        "would step the environments on its own)"
    )

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
    ):
        environments.check_environment(environment)
        check_whole("num_envs", num_envs)
        check_whole("rollout_length", rollout_length)
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}; 0.99 is usual.")
        check_whole("eval_episodes", eval_episodes, least=0, note=" (0: no evaluation)")
        check_whole("eval_max_steps", eval_max_steps)
        self.environment = environment
        self.num_envs = num_envs
        self.rollout_length = rollout_length
        self.gamma = gamma
        self.eval_episodes = eval_episodes
        self.eval_max_steps = eval_max_steps
        self._evaluate_episodes: Callable[[], tuple[tf.Tensor, tf.Tensor]] | None = None

    def check_can_train(
        self, strategy: tf.distribute.Strategy, options: StepOptions, *, has_train_data: bool
    ) -> None:
        name = type(self).__name__
        if has_train_data:
            raise ValueError(f"{name} makes its own data; do not pass train_data.")
        if options.grad_accum_steps != 1:
            raise ValueError(
                f"{name} does not accumulate gradients (got grad_accum_steps="
                f"{options.grad_accum_steps!r}): its updates draw their own minibatches "
                "from the rollout or the replay buffer. Leave grad_accum_steps at 1 and set "
                "the minibatch size with global_batch_size (--global_batch_size)."
            )
        replicas, num_envs = strategy.num_replicas_in_sync, self.num_envs
        if num_envs % replicas:
            raise ValueError(
                f"num_envs={num_envs} is not divisible by the {replicas} replicas; every "
                f"replica steps the same number of environments. Pass a multiple of "
                f"{replicas}, e.g. num_envs={(num_envs // replicas + 1) * replicas}."
            )
        self.check_settings(replicas)

    def check_settings(self, num_replicas: int) -> None:
        """Raises ValueError for a bad setting of a subclass for `num_replicas` replicas."""

    @property
    def envs_per_replica(self) -> int:
        return self.num_envs // self.num_replicas

    # ---- State. ----

    def build(self) -> None:
        start = self.environment.reset(
            tf.random.stateless_uniform(
                [self.num_envs, self.environment.noise_size], self._seed(Noise.ENVIRONMENT, -1)
            )
        )
        self.environments = StateVariables(name="environments")
        self.observation = self.environments.add("observation", start.observation, "float32")
        self.elapsed_steps = self.environments.add("elapsed_steps", start.elapsed_steps, "int32")
        self.episode_return = self.environments.add(
            "episode_return", tf.zeros([self.num_envs]), "float32"
        )
        self.statistics = EpisodeStatistics()

    def checkpoint_items(self) -> Mapping[str, object]:
        return {"environments": self.environments, "episode_statistics": self.statistics}

    # ---- Evaluation: greedy episodes. ----

    def greedy_actions(self, observation: tf.Tensor) -> tf.Tensor:
        """[n] int32: the action the trained policy takes without exploring (evaluation)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define greedy_actions(observation) to evaluate "
            "episodes (eval_episodes > 0)."
        )

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        """Plays `eval_episodes` greedy episodes from seeded starts; their mean and least return.

        The episodes run on the host's copy of the weights, outside
        `strategy.run`, from the same starts and environment noise at every
        evaluation, so any replica count reports the same numbers.
        """
        if not self.eval_episodes:
            return {}
        if self._evaluate_episodes is None:
            self._evaluate_episodes = tf.function(
                lambda: play_greedy_episodes(
                    self.environment,
                    self.greedy_actions,
                    count=self.eval_episodes,
                    max_steps=self.eval_max_steps,
                    seed=lambda t: self._seed(Noise.EVALUATION, t),
                )
            )
        returns, ended = (t.numpy() for t in self._evaluate_episodes())
        return {
            "mean_return": float(returns.mean()),
            "min_return": float(returns.min()),
            "episodes_ended": int(ended.sum()),
        }

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        return {"mean_return", "min_return", "episodes_ended"} if self.eval_episodes else set()

    def mean_return(self) -> tf.Tensor:
        """Mean return of the last 100 finished episodes (0 before the first one ends)."""
        return self.statistics.mean_return()

    def results_extra(self) -> dict[str, object]:
        return {
            "algorithm": self.algorithm,
            "num_envs": self.num_envs,
            "rollout_length": self.rollout_length,
            "env_steps": int(self.statistics.env_steps.numpy()),
            "episodes": int(self.statistics.episodes.numpy()),
            "mean_return_100": float(self.mean_return().numpy()),
        }

    # ---- Randomness keyed on the global environment index. ----

    def _seed(self, purpose: Noise, *data) -> tf.Tensor:
        return stateless_seed(self.options.seed, purpose, *data)

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
        arrays = {
            name: tf.TensorArray(dtype, size=self.rollout_length)
            for name, dtype in {**ROLLOUT_DTYPES, **(extras or {})}.items()
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
        env_steps = self.num_envs * self.rollout_length
        finished = self.statistics.record(
            rollout["ended_return"], (rollout["terminated"] + rollout["truncated"]) > 0, env_steps
        )
        return {
            "mean_return_100": outputs.Last(self.mean_return()),
            "episodes_finished": outputs.Sum(finished),
            "env_steps": outputs.Sum(tf.constant(env_steps, tf.int64)),
        }

    def gather_steps(self, per_replica_rollout: dict, names) -> dict[str, tf.Tensor]:
        """The rollout entries `names` of all replicas, [T, num_envs, ...] (cross-replica)."""
        return {name: self.strategy.gather(per_replica_rollout[name], axis=1) for name in names}
