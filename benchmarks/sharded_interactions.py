"""An interaction log as Parquet shards, streamed: `loops-recommender` (the rating model) on 1M
and 4M generated rows, its peak memory and step rate against the same rows read whole from one
CSV file (the in-memory path), the id pass's rows a second, and the input's rows a second
alone against the step's.

    python -m benchmarks.sharded_interactions                   # 1M and 4M rows
    python -m benchmarks.sharded_interactions --rows=1000000 --train_steps=300

The log: users and items with power-law frequencies (ids 0..rows/20 and 0..rows/100), a
rating of 1..5 from planted user and item biases and factors plus noise, a timestamp; all a
function of the seed. Shards of 250,000 rows in row groups of 16,384.

For each size:
- `id_pass_rows_per_s`: the pass that numbers the ids and counts the training rows
  (`loops.input.interaction_streams.InteractionLog`), in this process.
- `input_rows_per_s`: `--train_steps` batches read and prepared alone
  (`InteractionLog.train_batches`), drained in a `tf.function` as the step reads them (in
  Python, each batch would cost a call of its own), the stream's start included, its tracing
  not.
- `streamed` and `memory`: a `loops-recommender --model=rating` run of `--train_steps` on the
  shards and on the CSV file: its own examples a second (results.json), peak resident memory
  (`ru_maxrss` of the process), test RMSE and the bias baseline's (with no validation rows
  the run evaluates on its test rows; each path's own split: the
  stream's by a hash of each row, the file's by a random draw). `input_over_step` is the
  input's rate over the streamed step's (goal: >= 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from benchmarks import report
from benchmarks.sharded_input import measured_run

SHARD_ROWS, GROUP_ROWS = 250_000, 16_384


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--train_steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work_dir", default=os.path.expanduser("~/.cache/loops/interactions"))
    parser.add_argument("--output", default="sharded_interactions.json")
    return parser.parse_args(argv)


def log_columns(rows: int, seed: int) -> dict:
    """The generated log's columns (see the module docstring)."""
    rng = np.random.default_rng(seed)
    users, items = max(rows // 20, 10), max(rows // 100, 10)
    user = np.minimum(rng.zipf(1.3, rows), users) - 1
    item = np.minimum(rng.zipf(1.2, rows), items) - 1
    user_bias, item_bias = rng.normal(0, 0.5, users), rng.normal(0, 0.5, items)
    user_factors, item_factors = rng.normal(0, 0.5, (users, 4)), rng.normal(0, 0.5, (items, 4))
    liking = np.einsum("nd,nd->n", user_factors[user], item_factors[item])
    stars = 3.5 + user_bias[user] + item_bias[item] + liking + rng.normal(0, 0.7, rows)
    return {
        "user_id": user.astype(np.int64),
        "item_id": item.astype(np.int64),
        "rating": np.clip(np.round(stars), 1, 5).astype(np.float32),
        "timestamp": 880_000_000 + np.sort(rng.integers(0, 10**7, rows)),
    }


def write_log(rows: int, args) -> tuple[str, str]:
    """The log's Parquet shards and its CSV file (written once, kept in --work_dir)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = os.path.join(args.work_dir, f"rows_{rows}_seed_{args.seed}")
    shards, whole = os.path.join(folder, "shards"), os.path.join(folder, "log.csv")
    if os.path.exists(whole):
        return shards, whole
    os.makedirs(shards, exist_ok=True)
    columns = log_columns(rows, args.seed)
    table = pa.table(columns)
    for first in range(0, rows, SHARD_ROWS):
        path = os.path.join(shards, f"part-{first // SHARD_ROWS:05d}.parquet")
        pq.write_table(table.slice(first, SHARD_ROWS), path, row_group_size=GROUP_ROWS)
    with open(whole + ".partial", "w") as stream:
        stream.write("user,item,rating,timestamp\n")
        for first in range(0, rows, 100_000):
            part = {name: values[first : first + 100_000] for name, values in columns.items()}
            lines = zip(*(part[n].tolist() for n in columns), strict=True)
            stream.write("".join(f"{u},{i},{r:g},{t}\n" for u, i, r, t in lines))
    os.replace(whole + ".partial", whole)
    return shards, whole


def run_recommender(data: str, model_dir: str, args) -> dict:
    """A loops-recommender run's examples a second, peak memory and test figures."""
    shutil.rmtree(model_dir, ignore_errors=True)  # this benchmark's own run of before
    command = [
        sys.executable,
        "-m",
        "loops.bin.recommender",
        f"--data={data}",
        f"--model_dir={model_dir}",
        "--model=rating",
        f"--train_steps={args.train_steps}",
        f"--eval_every={args.train_steps}",
        f"--global_batch_size={args.batch}",
        "--validation_fraction=0",
        "--embedding_dim=16",
        "--table_optimizer=adagrad",
        "--table_learning_rate=0.05",
        "--strategy=default",
    ]
    figures, child = measured_run(command)
    if child is None:
        return figures
    with open(os.path.join(model_dir, "results.json")) as stream:
        results = json.load(stream)
    figures.update(
        step_rows_per_s=round(results["pairs_per_second"]),
        peak_rss_mb=round(child["maxrss_kb"] / 1024),
        test_rmse=round(results["eval"]["rmse"], 4),
        bias_baseline_rmse=round(results["eval"]["bias_baseline_rmse"], 4),
        train_rows=results["data"]["train_interactions"],
    )
    return figures


def input_figures(shards: str, args) -> dict:
    """The id pass's and the streamed batches' rows a second, in this process."""
    from loops.input.interaction_streams import InteractionLog
    from loops.input.sharded_logs import ShardedLog
    from loops.input.streaming_fit import Split

    started = time.perf_counter()
    log = ShardedLog.open(shards)
    rows = InteractionLog(log, Split(0.2))
    passed = time.perf_counter() - started
    batches = rows.train_batches(with_ratings=True, global_batch_size=args.batch, seed=0)
    import tensorflow as tf

    count = max(min(args.train_steps, rows.fitted.rows["train"] // args.batch), 1)

    @tf.function
    def drained(dataset: tf.data.Dataset) -> tf.Tensor:
        # In a graph, as the step reads it: no Python between batches.
        total = tf.constant(0, tf.int64)
        for batch in dataset:
            total += tf.cast(tf.shape(batch[0])[0], tf.int64)
        return total

    drained(batches().take(1))  # traced once, on a stream of one batch
    started = time.perf_counter()
    read_rows = int(drained(batches().take(count)))
    read = time.perf_counter() - started
    return {
        "id_pass_rows_per_s": round(log.num_rows / passed),
        "input_rows_per_s": round(read_rows / read),
        "users": rows.fitted.num_users,
        "items": rows.fitted.num_items,
    }


def measure(args) -> dict:
    sizes = []
    for rows in args.rows:
        shards, whole = write_log(rows, args)
        figures = {"rows": rows, **input_figures(shards, args)}
        figures["streamed"] = run_recommender(shards, os.path.join(args.work_dir, "run_s"), args)
        figures["memory"] = run_recommender(whole, os.path.join(args.work_dir, "run_m"), args)
        step = figures["streamed"].get("step_rows_per_s")
        figures["input_over_step"] = round(figures["input_rows_per_s"] / step, 2) if step else None
        print(json.dumps(figures), flush=True)
        sizes.append(figures)
    return {"sizes": sizes}


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    figures = measure(args)
    print(json.dumps(figures, indent=1))
    report.write(args, **figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
