"""Trains a CartPole-v1 agent (PPO or double DQN) in the graph: `python -m loops.bin.rl`."""

from __future__ import annotations

from absl import app, flags

from loops import flags as loop_flags

# Shared flags whose best value depends on the algorithm default to None here
# and are filled in from ALGORITHM_DEFAULTS (the other knobs' defaults are the
# loop classes' own).
loop_flags.define_loop_flags(
    train_steps=None, global_batch_size=None, learning_rate=1e-3, steps_per_loop=None
)
ALGORITHM_DEFAULTS = {
    # 250 rollouts of 16 x 64 steps; the mean return passes 195 after about 50
    # of them and reaches 500 after about 200.
    "ppo": {"train_steps": 250, "steps_per_loop": 10},
    # 1500 steps of 8 x 4 transitions, each followed by 2 updates.
    "dqn": {"train_steps": 1500, "steps_per_loop": 100},
}
with loop_flags.heading("training"):
    flags.DEFINE_enum(
        "algorithm",
        "ppo",
        list(ALGORITHM_DEFAULTS),
        "ppo: actor-critic (PPO with GAE); dqn: double DQN with a replay buffer. "
        "Unset shared flags take the algorithm's defaults: --train_steps 250 (ppo) "
        "or 1500 (dqn), --steps_per_loop 10 or 100, --global_batch_size (samples "
        "per update) 256 or 128.",
    )
with loop_flags.heading("data"):
    flags.DEFINE_integer(
        "num_envs",
        None,
        "Environments stepped in parallel over all replicas (a multiple of the "
        "replica count). Default 16 (ppo), 8 (dqn).",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "rollout_length",
        None,
        "Steps of every environment per train step. Default 64 (ppo), 4 (dqn).",
        lower_bound=1,
    )
with loop_flags.heading("outputs"):
    flags.DEFINE_integer(
        "eval_episodes",
        0,
        "Episodes each evaluation plays with the greedy policy, from the same "
        "seeded starts every time (eval metrics mean_return, min_return, e.g. "
        "for --keep_best_metric=mean_return --keep_best_mode=max); 0: no "
        "evaluation. Needed by --mode=evaluate_checkpoints.",
        lower_bound=0,
    )
with loop_flags.heading("training"):
    flags.DEFINE_float(
        "gamma", 0.99, "Discount factor in [0, 1].", lower_bound=0.0, upper_bound=1.0
    )
    # PPO.
    flags.DEFINE_float(
        "gae_lambda", 0.95, "ppo: GAE lambda in [0, 1].", lower_bound=0.0, upper_bound=1.0
    )
    flags.DEFINE_integer(
        "ppo_epochs",
        4,
        "ppo: passes over each rollout (1 with "
        "--global_batch_size=num_envs*rollout_length is A2C).",
        lower_bound=1,
    )
    flags.DEFINE_float("clip_ratio", 0.2, "ppo: probability-ratio clip epsilon (> 0).")
    flags.DEFINE_float("value_coefficient", 0.5, "ppo: weight of the value loss.", lower_bound=0.0)
    flags.DEFINE_float(
        "entropy_coefficient", 0.01, "ppo: weight of the entropy bonus.", lower_bound=0.0
    )
    # DQN.
    flags.DEFINE_integer(
        "buffer_capacity", 50_000, "dqn: transitions the replay buffer keeps.", lower_bound=1
    )
    flags.DEFINE_integer(
        "learning_starts",
        1_000,
        "dqn: transitions collected before the first update.",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "updates_per_step", 2, "dqn: gradient updates per train step.", lower_bound=1
    )
    flags.DEFINE_float(
        "epsilon_start",
        1.0,
        "dqn: exploration rate at the start.",
        lower_bound=0.0,
        upper_bound=1.0,
    )
    flags.DEFINE_float(
        "epsilon_end",
        0.05,
        "dqn: exploration rate after --exploration_steps.",
        lower_bound=0.0,
        upper_bound=1.0,
    )
    flags.DEFINE_integer(
        "exploration_steps",
        10_000,
        "dqn: environment steps over which epsilon falls linearly.",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "target_update_every",
        None,
        "dqn: copy the online net into the "
        "target every this many train steps (default 50, unless --target_tau "
        "is set).",
        lower_bound=1,
    )
    flags.DEFINE_float(
        "target_tau",
        None,
        "dqn: instead of copies, move the target towards "
        "the online net by this fraction every train step (in (0, 1], e.g. "
        "0.005).",
    )
flags.register_validator(
    "clip_ratio",
    lambda value: value > 0,
    message="--clip_ratio must be > 0, e.g. --clip_ratio=0.2.",
)
flags.register_validator(
    "target_tau",
    lambda value: value is None or 0 < value <= 1,
    message="--target_tau must be in (0, 1], e.g. --target_tau=0.005.",
)

FLAGS = flags.FLAGS
SOLVED_RETURN = 475.0  # CartPole-v1's reward threshold
# The bar of the original CartPole (v0): a learner that passes it has clearly learned.
LEARNED_RETURN = 195.0


def _given(**values):
    """The keyword arguments whose flag has a value (None: the loop's default)."""
    return {name: value for name, value in values.items() if value is not None}


def build_loop():
    """The RL loop the flags describe, on CartPole; ValueError for a bad combination."""
    import keras

    from loops import rl
    from loops_data import cartpole
    from loops_models import rl as rl_models

    strategy = loop_flags.make_strategy()
    environment = cartpole.CartPole()
    # Seeded with the loop's seed, so runs on any replica count start from the same weights.
    network_arguments = {
        "observation_size": environment.observation_size,
        "num_actions": environment.num_actions,
        "seed": FLAGS.seed,
    }
    common = {
        "environment": environment,
        "optimizer_fn": lambda: keras.optimizers.Adam(FLAGS.learning_rate),
        "gamma": FLAGS.gamma,
        "eval_episodes": FLAGS.eval_episodes,
        **_given(
            num_envs=FLAGS.num_envs,
            rollout_length=FLAGS.rollout_length,
            global_batch_size=FLAGS.global_batch_size,
            clip_norm=FLAGS.clip_norm,
        ),
        **loop_flags.loop_arguments(
            strategy, loop_flags.resolve_model_dir(f"rl-{FLAGS.algorithm}")
        ),
    }
    if FLAGS.algorithm == "ppo":
        return rl.ActorCriticLoop(
            model_fn=lambda: rl_models.policy_value_network(**network_arguments),
            gae_lambda=FLAGS.gae_lambda,
            epochs=FLAGS.ppo_epochs,
            clip_ratio=FLAGS.clip_ratio,
            value_coefficient=FLAGS.value_coefficient,
            entropy_coefficient=FLAGS.entropy_coefficient,
            **common,
        )
    return rl.DQNLoop(
        model_fn=lambda: rl_models.q_network(**network_arguments),
        buffer_capacity=FLAGS.buffer_capacity,
        learning_starts=FLAGS.learning_starts,
        updates_per_step=FLAGS.updates_per_step,
        epsilon_start=FLAGS.epsilon_start,
        epsilon_end=FLAGS.epsilon_end,
        exploration_steps=FLAGS.exploration_steps,
        target_update_every=FLAGS.target_update_every,
        target_tau=FLAGS.target_tau,
        **common,
    )


def summarize(loop) -> str:
    results = loop.results_extra()
    mean_return = results["mean_return_100"]
    verdict = (
        "solved (>= 475)"
        if mean_return >= SOLVED_RETURN
        else "learned (>= 195)"
        if mean_return >= LEARNED_RETURN
        else "below 195"
    )
    return (
        f"{results['algorithm']}: mean return of the last 100 episodes {mean_return:.1f}, "
        f"{verdict}; {results['episodes']} episodes, {results['env_steps']} environment "
        f"steps at {loop.units_per_second or 0:.0f} per second"
    )


def fill_in_algorithm_defaults() -> None:
    """Gives the unset shared flags of ALGORITHM_DEFAULTS the --algorithm's values."""
    for name, value in ALGORITHM_DEFAULTS[FLAGS.algorithm].items():
        if FLAGS[name].value is None:
            FLAGS[name].value = value


def main(argv):
    if loop_flags.mode() == loop_flags.EVALUATE_CHECKPOINTS and not FLAGS.eval_episodes:
        raise app.UsageError(
            "loops-rl evaluates a checkpoint by playing greedy episodes, and "
            "--eval_episodes is 0: pass e.g. --eval_episodes=10 (to the trainer too, "
            "for the same evaluation there)."
        )
    fill_in_algorithm_defaults()
    loop_flags.run_binary(argv, build_loop, summary=summarize)


def run():
    """Console-script entry point (loops-rl)."""
    loop_flags.run(main, description=__doc__)


if __name__ == "__main__":
    run()
