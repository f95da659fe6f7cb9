"""Wall time for the default PPO loop to solve CartPole-v1, on 1 and on 2 replicas.

Solved means CartPole-v1's bar: a mean return >= 475 over the last 100
episodes. Each run uses `loops-rl`'s default settings (16 environments, 64-step
rollouts, 10 train steps per tf.function call) and checks the mean return
after every call; the time includes building the loop and tracing.

    python -m benchmarks.rl_solve_time                      # 1 and 2 replicas
    python -m benchmarks.rl_solve_time --replica_counts=2 --max_train_steps=600
"""

from __future__ import annotations

import json
import time

from absl import app, flags

FLAGS = flags.FLAGS
SOLVED_RETURN = 475.0


def define_flags() -> None:
    """Defines this program's flags; when it runs, never at import, where a process may
    already hold a binary's --seed (absl refuses a flag defined twice)."""
    flags.DEFINE_list(
        "replica_counts",
        ["1", "2"],
        "Replica counts to time: 1 runs on the default strategy, more on a "
        "MirroredStrategy over that many logical CPUs.",
    )
    flags.DEFINE_integer(
        "max_train_steps", 1000, "Give up after this many train steps.", lower_bound=1
    )
    flags.DEFINE_integer("seed", 0, "Seed of the loops.")
    flags.DEFINE_string("output", None, "Also write the results as JSON to this path.")


def time_to_solve(num_replicas: int, *, max_train_steps: int, seed: int) -> dict:
    """Trains the default ActorCriticLoop until solved; returns the numbers of the run."""
    import loops
    from loops.kinds import rl
    from loops_data import cartpole
    from loops_models import rl as rl_models

    started = time.perf_counter()
    environment = cartpole.CartPole()
    loop = loops.Trainer(
        rl.ActorCriticLoop(
            environment=environment,
            model_fn=lambda: rl_models.policy_value_network(
                observation_size=environment.observation_size,
                num_actions=environment.num_actions,
                seed=seed,
            ),
        ),
        strategy=loops.testing.replica_strategy(num_replicas),
        steps_per_loop=10,
        seed=seed,
        progress=loops.testing.quiet_progress(),
    )
    mean_return = 0.0
    while loop.state.step < max_train_steps and mean_return < SOLVED_RETURN:
        loop.train(min(loop.state.step + loop.controller.options.steps_per_loop, max_train_steps))
        mean_return = float(loop.definition.mean_return().numpy())
    seconds = time.perf_counter() - started
    results = loop.definition.results_extra()
    return {
        "num_replicas": num_replicas,
        "solved": mean_return >= SOLVED_RETURN,
        "seconds": round(seconds, 1),
        "train_steps": loop.state.step,
        "env_steps": results["env_steps"],
        "episodes": results["episodes"],
        "mean_return_100": round(mean_return, 1),
        "env_steps_per_second": round(results["env_steps"] / seconds),
    }


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}; every option is a --flag.")
    counts = [int(count) for count in FLAGS.replica_counts]
    import loops
    from loops.cli import application

    application.quiet_logging()

    # Split the CPU once, before any TensorFlow op, for the largest count.
    loops.configure_logical_cpus(max(counts))
    rows = [
        time_to_solve(count, max_train_steps=FLAGS.max_train_steps, seed=FLAGS.seed)
        for count in counts
    ]
    print(
        "replicas | solved | seconds | train steps | env steps | episodes | mean return "
        "| env steps/s (incl. tracing)"
    )
    for row in rows:
        print(
            f"{row['num_replicas']:8} | {str(row['solved']):6} | {row['seconds']:7} | "
            f"{row['train_steps']:11} | {row['env_steps']:9} | {row['episodes']:8} | "
            f"{row['mean_return_100']:11} | {row['env_steps_per_second']}"
        )
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(rows, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
