"""Whether a step's cost follows the batch or the table: one embedding table trained through
`loops.Update` against a plain `strategy.run` loop with Keras' own optimizer.

    python -m benchmarks.embedding_tables                      # 1K, 100K, 1M rows; 1 and 2 replicas
    python -m benchmarks.embedding_tables --rows=10000000 --replicas=1

The model is a user's definition with no special layer: `keras.layers.Embedding(R, 32)`,
its looked-up rows averaged, a Dense head, the squared error; Adagrad; a global batch of
512 examples of 2 ids each, so a step touches at most 1,024 rows (issue 42's table). Modes:

- loops: `loops.Update` (the table's gradient sparse: duplicates summed, rows gathered
  across replicas, Adagrad on the touched rows only).
- plain: `strategy.run` of a tape and `optimizer.apply_gradients` (Keras 3's Adagrad, which
  all-reduces and updates the whole table).

Each mode's steps are timed in rounds that take turns, the median round's steps/s kept;
`loops/plain` is their ratio, `vs smallest` each mode's steps/s over its own at the
smallest table (the target: >= 0.8 at 1M rows, and loops >= 1.5x plain from 100K rows up).
`CPU ms` is each mode's median CPU time a step (all threads), steadier on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks import report

MODES = ("loops", "plain")
DIM, LOOKUPS, RATE = 32, 2, 0.05


def table_arguments(
    argv, description: str, *, rows: str, batch: int, smallest: int, output: str, **more
) -> argparse.Namespace:
    """The flags of a table benchmark (sizes, replica counts, steps, rounds, batch, output
    and `more`: flag name -> add_argument keywords), parsed and checked."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows", default=rows, help="comma-separated table sizes")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    for name, keywords in more.items():
        parser.add_argument(f"--{name}", **keywords)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=batch)
    parser.add_argument("--output", default=os.path.join("benchmarks", "results", output))
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",") if r]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    if min(args.rows, default=0) < smallest or min(args.replicas, default=0) < 1:
        parser.error(f"--rows must be >= {smallest} and --replicas >= 1")
    if args.steps < 1 or args.rounds < 1 or args.global_batch_size < max(args.replicas):
        parser.error("--steps and --rounds must be >= 1, --global_batch_size >= the replicas")
    return args


def parse_args(argv=None):
    return table_arguments(
        argv,
        __doc__.split("\n\n")[0],
        rows="1000,100000,1000000",
        batch=512,
        smallest=LOOKUPS,
        output="embedding_tables.json",
    )


def make_model(rows: int):
    import keras

    ids = keras.Input((LOOKUPS,), dtype="int32")
    vectors = keras.layers.Embedding(rows, DIM)(ids)
    return keras.Model(ids, keras.layers.Dense(1)(keras.ops.mean(vectors, axis=1)))


def split_over_replicas(strategy, values):
    """A nest of global-batch arrays as per-replica values, each replica its contiguous share
    of the rows (a batch that the replicas divide)."""
    import tensorflow as tf

    def split(array):
        share = len(array) // strategy.num_replicas_in_sync
        return strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(array[context.replica_id_in_sync_group * share :][:share])
        )

    return tf.nest.map_structure(split, values)


def batch(strategy, rows: int, global_batch_size: int):
    """One global batch of ids and targets, split over the replicas."""
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, rows, (global_batch_size, LOOKUPS)).astype(np.int32)
    targets = rng.normal(size=(global_batch_size,)).astype(np.float32)
    return split_over_replicas(strategy, (ids, targets))


def loops_step(strategy, rows: int, global_batch_size: int):
    """() -> None: one step of `loops.Update`."""
    import keras
    import tensorflow as tf

    import loops

    with strategy.scope():
        model = make_model(rows)
        optimizer = keras.optimizers.Adagrad(RATE)
        optimizer.build(model.trainable_variables)
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
        )
        update = loops.Update(context, optimizer, model)

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        errors = tf.squeeze(model(ids, training=True), -1) - targets
        return loops.scale_to_global_batch(errors**2, count), {}

    step = tf.function(lambda *args: update(replica_loss, args=args).sums["loss"])
    args = batch(strategy, rows, global_batch_size)
    return lambda: step(*args)


def plain_step(strategy, rows: int, global_batch_size: int):
    """() -> None: one step of a plain `strategy.run` loop with Keras' Adagrad."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        model = make_model(rows)
        optimizer = keras.optimizers.Adagrad(RATE)
        optimizer.build(model.trainable_variables)

    def replica(ids, targets):
        with tf.GradientTape() as tape:
            errors = tf.squeeze(model(ids, training=True), -1) - targets
            loss = tf.reduce_sum(errors**2) / global_batch_size
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    step = tf.function(lambda *args: strategy.run(replica, args=args))
    args = batch(strategy, rows, global_batch_size)
    return lambda: step(*args)


def steps_per_second(steppers: dict, steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Each mode's (steps per wall second, CPU ms a step), medians over `rounds`, the modes
    taking turns. CPU time (every thread of the process) is the steadier cost where other
    processes share the cores: they lengthen the wall time, not the CPU time."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                result = step()
            _ = [float(v) for v in _flat(result)]  # waits for the last step
            samples[name].append(
                (
                    steps / (time.perf_counter() - wall),
                    1e3 * (time.process_time() - cpu) / steps,
                )
            )
    return {
        name: (
            statistics.median(rate for rate, _ in values),
            statistics.median(cost for _, cost in values),
        )
        for name, values in samples.items()
    }


def _flat(result):
    import tensorflow as tf

    return [tf.reduce_sum(v) for v in tf.nest.flatten(getattr(result, "values", result))]


def measure(args) -> list[dict]:
    import loops

    rows = []
    for replicas in args.replicas:
        strategy = loops.testing.replica_strategy(replicas)
        smallest: dict[str, float] = {}
        for table_rows in args.rows:
            steppers = {
                "loops": loops_step(strategy, table_rows, args.global_batch_size),
                "plain": plain_step(strategy, table_rows, args.global_batch_size),
            }
            for step in steppers.values():
                step()  # trace
                step()
            measured = steps_per_second(steppers, args.steps, args.rounds)
            rates = {mode: measured[mode][0] for mode in MODES}
            smallest = smallest or rates
            rows.append(
                {
                    "rows": table_rows,
                    "replicas": replicas,
                    **{f"{mode}_steps_per_second": rates[mode] for mode in MODES},
                    **{f"{mode}_cpu_ms_per_step": measured[mode][1] for mode in MODES},
                    "loops_over_plain": rates["loops"] / rates["plain"],
                    **{f"{mode}_vs_smallest": rates[mode] / smallest[mode] for mode in MODES},
                }
            )
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'rows':>9} {'replicas':>8} {'loops steps/s':>13} {'plain steps/s':>13} "
        f"{'loops/plain':>11} {'loops vs smallest':>17} {'plain vs smallest':>17} "
        f"{'loops CPU ms':>12} {'plain CPU ms':>12}"
    ]
    for row in rows:
        lines.append(
            f"{row['rows']:>9} {row['replicas']:>8} {row['loops_steps_per_second']:13.1f} "
            f"{row['plain_steps_per_second']:13.1f} {row['loops_over_plain']:11.2f} "
            f"{row['loops_vs_smallest']:17.2f} {row['plain_vs_smallest']:17.2f} "
            f"{row['loops_cpu_ms_per_step']:12.2f} {row['plain_cpu_ms_per_step']:12.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
