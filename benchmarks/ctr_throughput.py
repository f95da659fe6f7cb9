"""Examples a second of the click-through step on a Criteo-shaped batch: `loops.Update` (what
`loops.CTRLoop` trains with) against a plain Keras `strategy.run` loop with the same model.

    python -m benchmarks.ctr_throughput                  # 1M and 10M rows, 1 and 2 replicas
    python -m benchmarks.ctr_throughput --model=dlrm --rows=1000000 --replicas=1

The model is `loops_models.ctr`'s (`--model`: dcn_v2 by default, wide_and_deep, dlrm) over
Criteo's columns: 13 numeric, 26 categorical and 2 multi-hot bags (up to 5 ids, some
empty). `--rows` is the largest table's size; categorical column k holds rows / 4**k values
(at least 10): at 10M rows, 10M, 2.5M, 625K, ... about 13.3M rows in all. Ids are drawn
with power-law frequencies, as in a click log; one global batch, split over the replicas,
is reused every step. Both modes train the tables with Adagrad and the rest with Adam:

- loops: `loops.Update(..., table_optimizer=Adagrad)`: a table's gradient stays sparse
  (duplicates summed, rows gathered across replicas), Adagrad touches those rows only.
- plain: a tape, then Keras' `apply_gradients` of each optimizer on its own variables in
  replica context (Keras 3 updates every row of each table).

Each mode's steps are timed in rounds that take turns, the median kept
(`benchmarks.embedding_tables.steps_per_second`); `loops/plain` is the ratio of their
examples a second (issue 54's target: >= 1.5 at 10M rows, 1 and 2 replicas). Both modes
take the same steps from the same weights, so their losses after the timed steps agree (the
report's `*_first_loss` and `*_last_loss`): the same training, at two speeds.
"""

from __future__ import annotations

import sys

from benchmarks import report
from benchmarks.embedding_tables import split_over_replicas, steps_per_second, table_arguments

MODES = ("loops", "plain")
NUMERIC, CATEGORICAL, BAGS = 13, 26, ("tags", "history")
BAG_ROWS, LONGEST_BAG, SMALLEST = 1000, 5, 10
MODELS = ("dcn_v2", "wide_and_deep", "dlrm")


def parse_args(argv=None):
    return table_arguments(
        argv,
        __doc__.split("\n\n")[0],
        rows="1000000,10000000",
        batch=1024,
        smallest=SMALLEST,
        output="ctr_throughput.json",
        model={"default": "dcn_v2", "choices": MODELS},
    )


def cardinalities(rows: int) -> dict[str, int]:
    """Categorical column name -> its table's rows: the largest `rows`, each next a quarter."""
    return {f"C{k + 1}": max(SMALLEST, rows // 4**k) for k in range(CATEGORICAL)}


def features(rows: int):
    from loops_models import ctr

    return ctr.CTRFeatures(
        numeric=[f"I{k + 1}" for k in range(NUMERIC)],
        categorical=cardinalities(rows),
        multi_hot={name: BAG_ROWS for name in BAGS},
    )


def global_batch(rows: int, size: int, seed: int = 0):
    """(columns, labels) of one global batch: numbers, power-law ids, bags padded with -1."""
    import numpy as np

    rng = np.random.default_rng(seed)

    def power_law(count: int, shape) -> np.ndarray:
        # Rank k drawn with probability about 1 / k: the head of the table is the busiest.
        ranks = np.exp(rng.uniform(0, np.log(count), shape)).astype(np.int64)
        return np.minimum(ranks - 1, count - 1)

    columns = {f"I{k + 1}": rng.normal(size=size).astype(np.float32) for k in range(NUMERIC)}
    for name, count in cardinalities(rows).items():
        columns[name] = power_law(count, size).astype(np.int32)
    for name in BAGS:
        bags = power_law(BAG_ROWS, (size, LONGEST_BAG)).astype(np.int32)
        lengths = rng.integers(0, LONGEST_BAG + 1, size)
        bags[np.arange(LONGEST_BAG)[None, :] >= lengths[:, None]] = -1
        columns[name] = bags
    return columns, (rng.random(size) < 0.25).astype(np.float32)


def replica_batch(strategy, rows: int, size: int):
    """The global batch as per-replica values, each replica its contiguous share."""
    return split_over_replicas(strategy, global_batch(rows, size))


def _model_and_optimizers(args, rows: int):
    import keras

    from loops_models import ctr

    model = ctr.build_model(args.model, features(rows), seed=0)
    dense, tables = keras.optimizers.Adam(1e-3), keras.optimizers.Adagrad(0.05)
    return model, dense, tables


def _is_table(variable) -> bool:
    return variable.path.endswith("embeddings")


def _losses(model, columns, labels):
    import tensorflow as tf

    logits = tf.reshape(model(columns, training=True), [-1])
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def loops_step(strategy, args, rows: int):
    """() -> the step's result: one step of `loops.Update`, tables by Adagrad."""
    import tensorflow as tf

    import loops

    with strategy.scope():
        model, dense, tables = _model_and_optimizers(args, rows)
        dense.build([v for v in model.trainable_variables if not _is_table(v)])
        tables.build([v for v in model.trainable_variables if _is_table(v)])
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
        )
        update = loops.Update(context, dense, model, table_optimizer=tables)

    def replica_loss(columns, labels):
        count = loops.global_count(tf.shape(labels)[0])
        return loops.scale_to_global_batch(_losses(model, columns, labels), count), {}

    step = tf.function(lambda *batch: update(replica_loss, args=batch).sums["loss"])
    batch = replica_batch(strategy, rows, args.global_batch_size)
    return lambda: step(*batch)


def plain_step(strategy, args, rows: int):
    """() -> the step's result: a plain `strategy.run` of a tape and Keras' optimizers."""
    import tensorflow as tf

    with strategy.scope():
        model, dense, tables = _model_and_optimizers(args, rows)
        table_variables = [v for v in model.trainable_variables if _is_table(v)]
        dense_variables = [v for v in model.trainable_variables if not _is_table(v)]
        dense.build(dense_variables)
        tables.build(table_variables)

    def replica(columns, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(_losses(model, columns, labels)) / args.global_batch_size
        gradients = tape.gradient(loss, [*table_variables, *dense_variables])
        split = len(table_variables)
        tables.apply_gradients(zip(gradients[:split], table_variables))
        dense.apply_gradients(zip(gradients[split:], dense_variables))
        return loss

    step = tf.function(
        lambda *batch: strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)
    )
    batch = replica_batch(strategy, rows, args.global_batch_size)
    return lambda: step(*batch)


def measure(args) -> list[dict]:
    import loops

    results = []
    for replicas in args.replicas:
        strategy = loops.testing.replica_strategy(replicas)
        for rows in args.rows:
            steppers = {
                "loops": loops_step(strategy, args, rows),
                "plain": plain_step(strategy, args, rows),
            }
            first = {mode: float(step()) for mode, step in steppers.items()}  # traces
            for step in steppers.values():
                step()
            measured = steps_per_second(steppers, args.steps, args.rounds)
            # Both modes ran the same steps from the same weights on the same batch.
            last = {mode: float(step()) for mode, step in steppers.items()}
            rates = {mode: measured[mode][0] * args.global_batch_size for mode in MODES}
            results.append(
                {
                    "model": args.model,
                    "rows": rows,
                    "table_rows": sum(cardinalities(rows).values()) + len(BAGS) * BAG_ROWS,
                    "replicas": replicas,
                    **{f"{mode}_examples_per_second": rates[mode] for mode in MODES},
                    **{f"{mode}_cpu_ms_per_step": measured[mode][1] for mode in MODES},
                    "loops_over_plain": rates["loops"] / rates["plain"],
                    "steps": 3 + args.steps * args.rounds,
                    **{f"{mode}_first_loss": first[mode] for mode in MODES},
                    **{f"{mode}_last_loss": last[mode] for mode in MODES},
                }
            )
            print(format_table(results[-1:]).splitlines()[-1], flush=True)
    return results


def format_table(rows: list[dict]) -> str:
    lines = [
        f"{'model':>13} {'rows':>9} {'all rows':>9} {'replicas':>8} {'loops ex/s':>11} "
        f"{'plain ex/s':>11} {'loops/plain':>11} {'loops CPU ms':>12} {'plain CPU ms':>12}"
    ]
    for row in rows:
        lines.append(
            f"{row['model']:>13} {row['rows']:>9} {row['table_rows']:>9} {row['replicas']:>8} "
            f"{row['loops_examples_per_second']:11.0f} {row['plain_examples_per_second']:11.0f} "
            f"{row['loops_over_plain']:11.2f} {row['loops_cpu_ms_per_step']:12.2f} "
            f"{row['plain_cpu_ms_per_step']:12.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
