"""Whether a table's step costs what its touched rows cost: `loops.Update`'s step on one replica
against its physical floor, the same rows' reads and writes alone, timed in one run.

    python -m benchmarks.table_floor                      # 1K, 1M and 10M rows, one replica
    python -m benchmarks.table_floor --rows=1000,100000 --steps=20

For each table size: the step of `benchmarks.embedding_tables` (a keras Embedding of 32 floats
a row, Adagrad through `loops.Update`, a global batch of 512 examples of 2 ids) and its floor:
a traced function that gathers the rows the step touches from a table and from an accumulator
of the same size and scatters them back (what an Adagrad row update must read and write at
least). Reported: each one's ms a step (median of interleaved rounds) and the step's ratio to
(the smallest table's step + this size's floor): 1 means the table's size costs the step only
what touching its rows costs; the target is <= 1.25 at 1M and 10M rows.
"""

from __future__ import annotations

import sys

from benchmarks import embedding_tables, report

DIM, LOOKUPS = embedding_tables.DIM, embedding_tables.LOOKUPS


def parse_args(argv=None):
    args = embedding_tables.table_arguments(
        argv,
        __doc__.split("\n\n")[0],
        rows="1000,1000000,10000000",
        batch=512,
        smallest=LOOKUPS,
        output="table_floor.json",
    )
    args.replicas = [1]
    return args


def floor_step(rows: int, global_batch_size: int):
    """() -> a tensor: the touched rows of a table and its accumulator read and written back."""
    import numpy as np
    import tensorflow as tf

    table = tf.Variable(tf.zeros([rows, DIM]))
    accumulator = tf.Variable(tf.zeros([rows, DIM]))
    ids = np.random.default_rng(0).integers(0, rows, global_batch_size * LOOKUPS)
    ids = tf.constant(ids, tf.int64)

    @tf.function
    def touch():
        unique, _ = tf.unique(ids)
        rows_read = tf.gather(table, unique)
        slots_read = tf.gather(accumulator, unique)
        accumulator.scatter_update(tf.IndexedSlices(slots_read + 1.0, unique))
        table.scatter_update(tf.IndexedSlices(rows_read - 0.01, unique))
        return tf.reduce_sum(rows_read[:1])

    return touch


def measure(args) -> list[dict]:
    import loops

    strategy = loops.testing.replica_strategy(1)
    rows = []
    smallest_step = None
    for table_rows in args.rows:
        steppers = {
            "step": embedding_tables.loops_step(strategy, table_rows, args.global_batch_size),
            "floor": floor_step(table_rows, args.global_batch_size),
        }
        for step in steppers.values():
            step()  # trace
            step()
        measured = embedding_tables.steps_per_second(steppers, args.steps, args.rounds)
        step_ms, floor_ms = (1e3 / measured[name][0] for name in ("step", "floor"))
        smallest_step = step_ms if smallest_step is None else smallest_step
        rows.append(
            {
                "rows": table_rows,
                "step_ms": step_ms,
                "floor_ms": floor_ms,
                "step_over_smallest_plus_floor": step_ms / (smallest_step + floor_ms),
            }
        )
        print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'rows':>9} {'step ms':>8} {'floor ms':>9} {'step / (smallest step + floor)':>30}"]
    for row in rows:
        lines.append(
            f"{row['rows']:>9} {row['step_ms']:8.3f} {row['floor_ms']:9.3f} "
            f"{row['step_over_smallest_plus_floor']:30.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
