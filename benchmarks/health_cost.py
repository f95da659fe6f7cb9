"""What the health metrics cost a step: the classifier trained with and without them.

    python -m benchmarks.health_cost                    # mlp and cnn, 1 and 2 replicas
    python -m benchmarks.health_cost --clip_norm=1.0    # clipping shares their all-reduce

Both modes train the digits classifier of `benchmarks.throughput` (same
weights, Adam, same batches) end to end through `Trainer.train`, in one
process, rounds interleaved, medians in us a step of wall and of CPU time:

- off: `health_every=None`: no health metrics.
- on: `health_every=10` (what --help suggests; off by default): each step the gradient's global norm
  (on several replicas without a clip norm, one more all-reduce of the
  gradient); one step in ten, a copy of the weights kept across the update
  and the update/weight norms.
- every_step: `health_every=1`: the update/weight norms at every step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks import report

MODES = {"off": None, "on": 10, "every_step": 1}  # mode -> health_every


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument("--steps", type=int, default=500, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--clip_norm", type=float, default=None, help="the classifier's clip norm")
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "health_cost.json")
    )
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    if not set(args.models) <= {"mlp", "cnn"}:
        parser.error(f"--models: use mlp and/or cnn, got {args.models}")
    if min(args.replicas, default=0) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--replicas, --steps and --rounds must be >= 1")
    return args


def trainer_runner(setup, health_every: int | None):
    """steps -> None: `Trainer.train` that many more steps of the classifier."""
    import keras

    import loops

    trainer = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=setup.model_fn,
            optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
            clip_norm=setup.args.clip_norm,
        ),
        strategy=setup.strategy,
        train_data=setup.data_fn,
        steps_per_loop=setup.args.steps_per_loop,
        health_every=health_every,
        progress=loops.testing.quiet_progress(),
    )
    return lambda steps: trainer.train(trainer.state.step + steps)


def interleaved_costs(runners: dict, steps: int, rounds: int) -> dict[str, list[tuple]]:
    """(wall us, CPU us) a step of each mode, `rounds` times, the modes taking turns.

    CPU time (every thread of the process) is the steadier cost where other
    processes share the cores: they lengthen the wall time, not the CPU time.
    """
    samples: dict[str, list[tuple]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            wall, cpu = time.perf_counter(), time.process_time()
            runner(steps)
            samples[name].append(
                (
                    1e6 * (time.perf_counter() - wall) / steps,
                    1e6 * (time.process_time() - cpu) / steps,
                )
            )
    return samples


def measure(args) -> list[dict]:
    from benchmarks import throughput

    rows = []
    for model_name in args.models:
        for replicas in args.replicas:
            setup = throughput.Setup(model_name, replicas, args)
            runners = {mode: trainer_runner(setup, every) for mode, every in MODES.items()}
            for runner in runners.values():
                runner(args.steps_per_loop)  # trace and warm up
            samples = interleaved_costs(runners, args.steps, args.rounds)
            medians = {
                mode: [statistics.median(column) for column in zip(*samples[mode])]
                for mode in MODES
            }
            for mode in MODES:
                wall, cpu = medians[mode]
                rows.append(
                    {
                        "model": model_name,
                        "replicas": replicas,
                        "mode": mode,
                        "wall_us_per_step": wall,
                        "cpu_us_per_step": cpu,
                        "cpu_us_over_off": cpu - medians["off"][1],
                        "cpu_ratio_to_off": cpu / medians["off"][1],
                        "samples": samples[mode],
                    }
                )
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'model':6} {'replicas':>8} {'mode':10} {'wall us':>9} {'CPU us':>9} "
        f"{'CPU us vs off':>14} {'x off':>6}"
    ]
    for row in rows:
        lines.append(
            f"{row['model']:6} {row['replicas']:>8} {row['mode']:10} "
            f"{row['wall_us_per_step']:9.0f} {row['cpu_us_per_step']:9.0f} "
            f"{row['cpu_us_over_off']:14.0f} {row['cpu_ratio_to_off']:6.3f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
