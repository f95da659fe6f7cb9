"""What the exact parameter-server mode costs a step: exact against async and one process.

    python -m benchmarks.parameter_server_modes                 # 2 workers, 1 and 2 servers
    python -m benchmarks.parameter_server_modes --servers=1 --steps=50

The digits-shaped classifier (an MLP, Adam, global batch 64 of random 8x8x1
images) trains end to end through `Trainer.train`:

- one_process: the default strategy, in this process (the reference).
- exact: `--strategy=parameter_server`, W workers and M servers on 127.0.0.1
  (processes this one starts), `parameter_server_mode="exact"`: per step the
  chief schedules W closures (one remote function call each, with its slice
  of the batch), fetches W sets of gradients, sums them and applies them on
  the servers.
- async: the same cluster, `parameter_server_mode="async"`: one closure a step,
  which computes and applies on its worker; nothing comes back but the logs.

Reported per mode: wall ms a step (median over rounds; exact and async
interleaved, one_process before them: once this process is a cluster's chief
it no longer reaches variables made before), the
closures scheduled a step, and the gradient bytes the workers send the chief a
step (W times the trained variables' bytes in exact, 0 in async, where each
worker sends its update to the servers itself). Each cluster is the chief of
one process: the exact and async rows of one server count share it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import report


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2, help="parameter servers (M)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "parameter_server_modes.json")
    )
    args = parser.parse_args(argv)
    args.replicas = [1]  # report.run splits the CPU by it
    if min(args.workers, args.servers, args.steps, args.rounds) < 1:
        parser.error("--workers, --servers, --steps and --rounds must be >= 1")
    return args


def data_fn(global_batch_size: int):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(1024, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(1024,), dtype=np.int64)
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch_size)


def trainer_runner(strategy, args, **settings):
    """(steps -> None, the trainer): `Trainer.train` that many more steps."""
    import keras

    import loops

    def model_fn():
        inputs = keras.Input((8, 8, 1))
        hidden = keras.layers.Dense(128, activation="relu")(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Dense(10)(hidden))

    trainer = loops.Trainer(
        loops.ClassifierLoop(model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-3)),
        strategy=strategy,
        train_data=data_fn(args.global_batch_size),
        steps_per_loop=args.steps,
        progress=loops.testing.quiet_progress(),
        **settings,
    )
    return (lambda steps: trainer.train(trainer.state.step + steps)), trainer


def interleaved_ms(runners: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """Wall ms a step of each mode, `rounds` times, the modes taking turns."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            started = time.perf_counter()
            runner(steps)
            samples[name].append(1e3 * (time.perf_counter() - started) / steps)
    return samples


def measure(args) -> list[dict]:
    import loops

    spec, processes = loops.testing.local_parameter_server(args.workers, args.servers)
    try:
        # First, while the servers start: once connected to a cluster, this process's
        # eager context no longer reaches variables made before.
        one, one_trainer = trainer_runner(loops.testing.replica_strategy(1), args)
        one(5)  # trace and warm up
        samples = interleaved_ms({"one_process": one}, args.steps, args.rounds)
        weights = one_trainer.definition.model.trainable_variables
        gradient_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in weights)
        strategy = loops.testing.parameter_server_strategy(spec)
        runners = {
            mode: trainer_runner(strategy, args, parameter_server_mode=mode)[0]
            for mode in ("exact", "async")
        }
        for runner in runners.values():
            runner(5)
        samples.update(interleaved_ms(runners, args.steps, args.rounds))
    finally:
        for process in processes.values():
            process.kill()
    closures = {"one_process": 0, "exact": args.workers, "async": 1}
    sent = {"one_process": 0, "exact": args.workers * gradient_bytes, "async": 0}
    medians = {mode: statistics.median(values) for mode, values in samples.items()}
    return [
        {
            "mode": mode,
            "workers": args.workers,
            "servers": args.servers,
            "wall_ms_per_step": medians[mode],
            "ratio_to_async": medians[mode] / medians["async"],
            "closures_per_step": closures[mode],
            "gradient_bytes_to_chief_per_step": sent[mode],
            "samples": samples[mode],
        }
        for mode in samples
    ]


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'mode':12} {'W':>2} {'M':>2} {'ms/step':>8} {'x async':>8} {'closures':>8} {'bytes':>9}"
    ]
    for row in rows:
        lines.append(
            f"{row['mode']:12} {row['workers']:>2} {row['servers']:>2} "
            f"{row['wall_ms_per_step']:8.2f} {row['ratio_to_async']:8.2f} "
            f"{row['closures_per_step']:>8} {row['gradient_bytes_to_chief_per_step']:>9}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    code = report.run(argv, parse_args, measure, format_table)
    # The coordinator's threads would go on trying to reach the killed tasks.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
