"""Trains a CartPole-v1 agent (PPO or double DQN) in the graph: `python -m loops.bin.rl`."""

from __future__ import annotations

from absl import flags

from loops.bin import binary_flags, flag_checks, summaries, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags

binary_flags.RL.define()
FLAGS = flags.FLAGS


def build_trainer():
    """The RL loop the flags describe, on CartPole; ValueError for a bad combination."""
    from loops.kinds import rl
    from loops.run.trainer import Trainer
    from loops_data import cartpole
    from loops_models import rl as rl_models

    arguments = loop_flags.binary_arguments(f"rl-{FLAGS.algorithm}", check_batch=False)
    env = cartpole.CartPole()
    # Seeded with the loop's seed, so runs on any replica count start from the same weights.
    network = dict(observation_size=env.observation_size, num_actions=env.num_actions)
    network["seed"] = FLAGS.seed
    common = loop_flags.setting_values(training_settings.ENVIRONMENT_LOOP)
    common.update(global_batch_size=FLAGS.global_batch_size, **loop_flags.clip_norm_argument())
    # None: the loop's own default (num_envs, rollout_length, global_batch_size).
    common = {name: value for name, value in common.items() if value is not None}
    common.update(environment=env, optimizer_fn=training_settings.adam_fn(FLAGS.learning_rate))
    if common.pop("algorithm") == "dqn":
        own = loop_flags.setting_values(training_settings.DQN)
        definition = rl.DQNLoop(model_fn=lambda: rl_models.q_network(**network), **own, **common)
        return Trainer(definition, **arguments)
    own = loop_flags.setting_values(training_settings.ACTOR_CRITIC)
    own["epochs"], decay = own.pop("ppo_epochs"), own.pop("ppo_lr_decay")
    ppo = rl.ActorCriticLoop(
        model_fn=lambda: rl_models.policy_value_network(**network), **own, **common
    )
    learning_rate, train_steps = FLAGS.learning_rate, FLAGS.train_steps

    def optimizer():
        # Made in build, after the loop has checked its settings (a rollout that holds no
        # minibatch is refused there with its own fix).
        updates = train_steps * ppo.epochs * ppo.minibatches
        rate = training_settings.ppo_learning_rate(decay, learning_rate, updates=updates)
        return training_settings.adam_fn(rate)()

    ppo.optimizer_fn = optimizer
    return Trainer(ppo, **arguments)


_HOOKS = flag_checks.Hooks(
    summary=summaries.reinforcement_learning, prepare=training_settings.prepare_rl_flags
)
main, run = application.entry_points(build_trainer, description=__doc__, **_HOOKS)

if __name__ == "__main__":
    run()
