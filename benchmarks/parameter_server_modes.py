"""What the exact parameter-server mode costs a step: exact against async and one process,
for the classifier and for a recommender whose tables are split over the servers.

    python -m benchmarks.parameter_server_modes                 # 2 workers, 2 servers, both cases
    python -m benchmarks.parameter_server_modes --servers=1 --steps=50 --case=recommender

Two cases train end to end through `Trainer.train`:

- classifier: the digits-shaped classifier (an MLP, Adam, global batch 64 of
  random 8x8x1 images).
- recommender: a rating model (`loops.RatingLoop`): a user and an item
  `loops.EmbeddingTable` (`--users` and `--items` rows of `--dim` floats, each
  split by rows over the M servers, Adagrad) whose rows' dot product scores a
  pair (squared error to a random rating); global batch 64 of random pairs.

Each in three modes:

- one_process: the default strategy, in this process (the reference).
- exact: `--strategy=parameter_server`, W workers and M servers on 127.0.0.1
  (processes this one starts), `parameter_server_mode="exact"`: per step the
  chief schedules W closures (one remote function call each, with its slice
  of the batch), fetches what they return (dense gradients; a table's as its
  slice's unique ids and their rows), sums them and applies them on the
  servers in one traced function.
- async: the same cluster, `parameter_server_mode="async"`: one closure a step,
  which computes and applies on its worker; nothing comes back but the logs.

Reported per case and mode: wall ms a step (median over rounds; exact and async
interleaved, one_process before them: once this process is a cluster's chief
it no longer reaches variables made before), its ratio to async, the closures
scheduled a step and the bytes the workers' results bring the chief a step
(measured in exact: `WorkerGradients.fetched_bytes`; 0 in async, where each
worker sends its update to the servers itself). One cluster serves every case
and mode of a run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import report

CASES = ("classifier", "recommender")
MODES = ("one_process", "exact", "async")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=2, help="parameter servers (M)")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--case", choices=(*CASES, "both"), default="both")
    parser.add_argument("--users", type=int, default=100_000, help="the user table's rows")
    parser.add_argument("--items", type=int, default=20_000, help="the item table's rows")
    parser.add_argument("--dim", type=int, default=32, help="the tables' row length")
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "parameter_server_modes.json")
    )
    args = parser.parse_args(argv)
    args.replicas = [1]  # report.run splits the CPU by it
    counts = (args.workers, args.servers, args.steps, args.rounds, args.users, args.items, args.dim)
    if min(counts) < 1:
        parser.error(
            "--workers, --servers, --steps, --rounds, --users, --items and --dim must be >= 1"
        )
    args.cases = list(CASES) if args.case == "both" else [args.case]
    return args


def data_fn(global_batch_size: int):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(1024, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(1024,), dtype=np.int64)
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch_size)


def pairs_fn(args):
    """Random (user, item, rating) pairs, batched: ids drawn over the whole tables."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    users = rng.integers(0, args.users, size=4096, dtype=np.int32)
    items = rng.integers(0, args.items, size=4096, dtype=np.int32)
    ratings = rng.uniform(1.0, 5.0, size=4096).astype(np.float32)
    pairs = (users, items, ratings)
    return lambda: tf.data.Dataset.from_tensor_slices(pairs).batch(args.global_batch_size)


def definition(case: str, args):
    """The case's definition and train data."""
    import keras

    import loops

    if case == "classifier":

        def model_fn():
            inputs = keras.Input((8, 8, 1))
            hidden = keras.layers.Dense(128, activation="relu")(keras.layers.Flatten()(inputs))
            return keras.Model(inputs, keras.layers.Dense(10)(hidden))

        loop = loops.ClassifierLoop(
            model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-3)
        )
        return loop, data_fn(args.global_batch_size)

    def rating_model():
        users, items = keras.Input((), dtype="int32"), keras.Input((), dtype="int32")
        tables = [
            loops.EmbeddingTable(rows, args.dim, keras.optimizers.Adagrad(0.1), name=name)
            for name, rows in (("users", args.users), ("items", args.items))
        ]
        score = keras.ops.sum(tables[0](users) * tables[1](items), axis=-1)
        return keras.Model([users, items], score)

    loop = loops.RatingLoop(
        model_fn=rating_model, optimizer_fn=lambda: keras.optimizers.Adagrad(0.1)
    )
    return loop, pairs_fn(args)


def trainer_runner(case: str, strategy, args, **settings):
    """(steps -> None, the trainer): `Trainer.train` that many more steps."""
    import loops

    loop, train_data = definition(case, args)
    trainer = loops.Trainer(
        loop,
        strategy=strategy,
        train_data=train_data,
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


def exact_counts(trainer) -> np.ndarray:
    """[closures scheduled, bytes fetched to the chief] so far by an exact-mode trainer."""
    counts = trainer.step_context.update.slice_gradients
    return np.array([counts.scheduled_closures, counts.fetched_bytes], np.float64)


def measure(args) -> list[dict]:
    import tensorflow as tf

    import loops

    spec, processes = loops.testing.local_parameter_server(args.workers, args.servers)
    samples: dict[tuple[str, str], list[float]] = {}
    sent: dict[str, np.ndarray] = {}
    try:
        # First, while the servers start: once connected to a cluster, this process's
        # eager context no longer reaches variables made before.
        for case in args.cases:
            one, _ = trainer_runner(case, loops.testing.replica_strategy(1), args)
            one(5)  # trace and warm up
            samples[(case, "one_process")] = interleaved_ms({0: one}, args.steps, args.rounds)[0]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(dict(spec)), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=loops.TablePartitioner(args.servers)
        )
        for case in args.cases:
            runners, trainers = {}, {}
            for mode in ("exact", "async"):
                runner, trainers[mode] = trainer_runner(
                    case, strategy, args, parameter_server_mode=mode
                )
                runner(5)
                runners[mode] = runner
            before = exact_counts(trainers["exact"])
            for mode, values in interleaved_ms(runners, args.steps, args.rounds).items():
                samples[(case, mode)] = values
            timed_steps = args.steps * args.rounds
            sent[case] = (exact_counts(trainers["exact"]) - before) / timed_steps
    finally:
        for process in processes.values():
            process.kill()
    return rows_of(args, samples, sent)


def rows_of(args, samples, sent) -> list[dict]:
    """One row a case and mode, with its ratio to the case's async mode."""
    rows = []
    for case in args.cases:
        medians = {mode: statistics.median(samples[(case, mode)]) for mode in MODES}
        closures, fetched = sent[case]
        for mode in MODES:
            rows.append(
                {
                    "case": case,
                    "mode": mode,
                    "workers": args.workers,
                    "servers": args.servers,
                    "wall_ms_per_step": medians[mode],
                    "ratio_to_async": medians[mode] / medians["async"],
                    "closures_per_step": {"one_process": 0, "exact": closures, "async": 1}[mode],
                    "bytes_to_chief_per_step": fetched if mode == "exact" else 0,
                    "samples": samples[(case, mode)],
                }
            )
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'case':12} {'mode':12} {'W':>2} {'M':>2} {'ms/step':>8} {'x async':>8} "
        f"{'closures':>8} {'bytes':>9}"
    ]
    for row in rows:
        lines.append(
            f"{row['case']:12} {row['mode']:12} {row['workers']:>2} {row['servers']:>2} "
            f"{row['wall_ms_per_step']:8.2f} {row['ratio_to_async']:8.2f} "
            f"{row['closures_per_step']:>8g} {row['bytes_to_chief_per_step']:>9.0f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    code = report.run(argv, parse_args, measure, format_table)
    # The coordinator's threads would go on trying to reach the killed tasks.
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
