"""A Criteo-shaped click log as shards, streamed: `loops-ctr` training on 1M, 10M (and 50M) rows
with its peak memory, the input's rows a second against the step's, the statistics pass's, and
the same rows through the in-memory path beside the streamed one.

    python -m benchmarks.sharded_input                                # 1M and 10M rows
    python -m benchmarks.sharded_input --rows=50000000 --formats=parquet --memory_limit_gb=3

The log: 13 numeric columns (Poisson counts, `"normalize": "log"`), 26 categorical columns
(ids 0..49,999 with power-law frequencies, as text; `"max_vocabulary": 20000`) and 2 multi-hot
bags (0..4 ids of 1,000), a label drawn from a planted logistic truth of the first numeric and
the first 4 categorical columns (about 25% clicks), all a function of the seed. Parquet
shards of 500,000 rows in row groups of 16,384; TFRecord shards of `tf.train.Example`s (written
by Python, so `--formats` takes them at the sizes of `--tfrecord_rows` only).

For each size and format:
- `fit_rows_per_s`: the statistics pass (`loops.input.streaming_fit.fit_log`) over the training
  rows, in this process.
- `input_rows_per_s`: batches of 1,024 read and prepared (`FeatureLog.train_batches`), alone.
- `step_rows_per_s`, `peak_rss_mb`: a `loops-ctr` run (DCN-v2, its tables by their own
  Adagrad, a sparse row update; one device) of `--train_steps` steps: its own examples a
  second (results.json) and its peak resident memory (the process's `ru_maxrss`), its
  statistics pass, evaluation and test included; `input_over_step` is the ratio of the two
  rates (goal: >= 2).
- With `--memory_limit_gb`, the run is held in a cgroup (v1 `memory.limit_in_bytes` or v2
  `memory.max`) of that size, smaller than the log's arrays (`array_gb`): it either finishes
  under the limit or is killed by it (`exit_code` -9).

`--in_memory_rows` (200,000): the first rows of the log as one Parquet file, trained by
`loops-ctr` read whole (the in-memory path) and streamed (`--format=parquet`), the same
steps: `memory_over_streamed` is the ratio of their step rates. `in_process` takes that
ratio apart in this process (`step_breakdown`): the step on cached batches, on the stream
of blocks prepared beforehand, and on the stream.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import report

NUMERIC, CATEGORICAL, BAGS = 13, 26, ("tags", "history")
CATEGORY_IDS, BAG_IDS, SHARD_ROWS, GROUP_ROWS = 50_000, 1_000, 500_000, 16_384
# Bytes of a row as the model's arrays (float32 numbers and label, int32 ids, bags of 5).
ARRAY_ROW_BYTES = 4 * (NUMERIC + CATEGORICAL + len(BAGS) * 5 + 1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--formats", default="parquet,tfrecord")
    parser.add_argument("--tfrecord_rows", default="1000000")
    parser.add_argument("--train_steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--input_batches", type=int, default=300)
    parser.add_argument("--in_memory_rows", type=int, default=200_000)
    parser.add_argument("--memory_limit_gb", type=float, default=0.0)
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "sharded_input"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="sharded_input.json")
    args = parser.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",")]
    args.formats = args.formats.split(",")
    args.tfrecord_rows = [int(r) for r in args.tfrecord_rows.split(",") if r]
    return args


def spec() -> dict:
    columns = [{"name": f"I{i}", "kind": "numeric", "normalize": "log"} for i in range(1, 14)]
    columns += [
        {"name": f"C{i}", "kind": "categorical", "min_count": 2, "max_vocabulary": 20_000}
        for i in range(1, 27)
    ]
    columns += [{"name": name, "kind": "multi_hot", "max_vocabulary": 1_000} for name in BAGS]
    return {"label": "label", "columns": columns}


def shard_columns(rows: int, seed: int) -> dict:
    """One shard's columns, a function of (seed, shard)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    # The label's planted truth: the first numeric and the first 4 categorical columns move it.
    truth = np.random.default_rng(12345)
    effects = truth.normal(0.0, 0.5, (4, CATEGORY_IDS))
    logits = np.full(rows, -1.4)
    columns: dict = {}
    for i in range(1, NUMERIC + 1):
        columns[f"I{i}"] = rng.poisson(rng.gamma(1.0, 3.0), rows).astype(np.float64)
    logits += 0.3 * (np.log1p(columns["I1"]) - 1.0)
    for i in range(1, CATEGORICAL + 1):
        ids = (rng.zipf(1.2, rows) - 1) % CATEGORY_IDS
        if i <= 4:
            logits += effects[i - 1, ids]
        columns[f"C{i}"] = pa.array(ids.astype(np.int64)).cast(pa.string())
    for name in BAGS:
        lengths = rng.integers(0, 5, rows)
        values = rng.integers(0, BAG_IDS, int(lengths.sum())).astype(str)
        cuts = np.cumsum(lengths)[:-1]
        columns[name] = ["|".join(bag) for bag in np.split(values, cuts)]
    columns["label"] = (rng.random(rows) < 1 / (1 + np.exp(-logits))).astype(np.int64)
    return columns


def write_log(folder: str, rows: int, file_format: str, seed: int) -> str:
    """The log's shards in `folder` (written once; a folder that holds them is kept)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = os.path.join(folder, ".done")
    if os.path.exists(done):
        return folder
    os.makedirs(folder, exist_ok=True)
    for shard, first in enumerate(range(0, rows, SHARD_ROWS)):
        columns = shard_columns(min(SHARD_ROWS, rows - first), seed * 100_003 + shard)
        path = os.path.join(folder, f"part-{shard:05d}")
        if file_format == "parquet":
            pq.write_table(pa.table(columns), path + ".parquet", row_group_size=GROUP_ROWS)
        else:
            write_examples(columns, path + ".tfrecord")
    with open(done, "w") as stream:
        stream.write(str(rows))
    return folder


def write_examples(columns: dict, path: str) -> None:
    import tensorflow as tf

    names = list(columns)
    lists = {n: (v.to_pylist() if hasattr(v, "to_pylist") else list(v)) for n, v in columns.items()}
    with tf.io.TFRecordWriter(path) as writer:
        for row in range(len(lists["label"])):
            feature = {}
            for name in names:
                value = lists[name][row]
                if name == "label":
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                elif name.startswith("I"):
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
                else:
                    parts = value.split("|") if name in BAGS and value else [value]
                    parts = [] if name in BAGS and not value else parts
                    data = [part.encode() for part in parts]
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=data))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


SPLIT = (0.01, 0.01)  # test, validation: a small evaluation beside a large training set


def input_figures(folder: str, args) -> dict:
    """The statistics pass's and the input's rows a second, in this process."""
    from loops.input import feature_streams, feature_tables, sharded_logs, streaming_fit

    log = sharded_logs.ShardedLog.open(folder)
    split = streaming_fit.Split(*SPLIT)
    started = time.perf_counter()
    fitted = streaming_fit.fit_log(
        feature_tables.FeatureSpec.from_json(spec()), log, split.bands()["train"]
    )
    fit_seconds = time.perf_counter() - started
    batches = feature_streams.FeatureLog(log, fitted, split).train_batches(
        global_batch_size=args.batch, seed=args.seed
    )
    iterator = iter(batches.batches_from(0))
    next(iterator)  # the first window read, the generator started
    started = time.perf_counter()
    for _ in range(args.input_batches):
        next(iterator)
    input_seconds = time.perf_counter() - started
    train_rows = split.bands()["train"][1] - split.bands()["train"][0]
    return {
        "shards": len(log.shards),
        "blocks": len(log.blocks),
        "disk_mb": round(sum(s.size for s in log.shards) / 2**20, 1),
        "fit_rows_per_s": round(log.num_rows * train_rows / fit_seconds),
        "input_rows_per_s": round(args.input_batches * args.batch / input_seconds),
    }


def run_ctr(data: str, model_dir: str, args, *extra: str) -> dict:
    """A loops-ctr run's examples a second, peak memory and exit code (held in a cgroup of
    `--memory_limit_gb` when given)."""
    shutil.rmtree(model_dir, ignore_errors=True)  # this benchmark's own run of before
    spec_path = os.path.join(args.work_dir, "spec.json")
    with open(spec_path, "w") as stream:
        json.dump(spec(), stream)
    command = [
        sys.executable,
        "-m",
        "loops.bin.ctr",
        f"--data={data}",
        f"--spec={spec_path}",
        f"--model_dir={model_dir}",
        f"--train_steps={args.train_steps}",
        f"--eval_every={args.train_steps}",
        f"--global_batch_size={args.batch}",
        f"--test_fraction={SPLIT[0]}",
        f"--validation_fraction={SPLIT[1]}",
        "--strategy=default",
        # The tables' own sparse optimizer, as a click-through run trains them: a step whose
        # cost follows the batch, not the tables' rows (the harder step for the input to feed).
        "--table_optimizer=adagrad",
        "--table_learning_rate=0.05",
        *extra,
    ]
    with _memory_limit(args.memory_limit_gb) as enter:
        figures, child = measured_run(command, preexec_fn=enter)
    if child is None:
        return figures
    with open(os.path.join(model_dir, "results.json")) as stream:
        results = json.load(stream)
    figures.update(
        step_rows_per_s=round(results["examples_per_second"]),
        peak_rss_mb=round(child["maxrss_kb"] / 1024),
        test_auc=round(results["test"]["auc"], 4),
        train_rows=results["data"]["train_rows"],
    )
    return figures


# Runs a command and prints its peak resident memory (the children's ru_maxrss) as JSON.
MEASURED = (
    "import json, resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=sys.stderr).returncode\n"
    "print(json.dumps({'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
    "sys.exit(code)\n"
)


def measured_run(command: list, *, preexec_fn=None) -> tuple[dict, dict | None]:
    """Runs `command` in a child that reports its peak memory (`MEASURED`): (exit_code and
    wall_s, with the error's last lines where it failed; the child's report, None then)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, *command],
        capture_output=True,
        text=True,
        preexec_fn=preexec_fn,
    )
    figures: dict = {
        "exit_code": done.returncode,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if done.returncode:
        figures["error"] = (done.stderr or done.stdout)[-800:]
        return figures, None
    return figures, json.loads(done.stdout.strip().splitlines()[-1])


class _memory_limit:
    """A cgroup of `gb` GiB that the measured process enters before it starts (none for 0)."""

    def __init__(self, gb: float):
        self.gb, self.path = gb, None

    def __enter__(self):
        if not self.gb:
            return None
        limit = str(int(self.gb * 2**30))
        v1 = "/sys/fs/cgroup/memory"
        if os.path.isdir(v1):
            self.path = os.path.join(v1, f"sharded_input_{os.getpid()}")
            os.makedirs(self.path, exist_ok=True)
            _write(os.path.join(self.path, "memory.limit_in_bytes"), limit)
        else:
            self.path = f"/sys/fs/cgroup/sharded_input_{os.getpid()}"
            os.makedirs(self.path, exist_ok=True)
            _write(os.path.join(self.path, "memory.max"), limit)
        procs = os.path.join(self.path, "cgroup.procs")
        return lambda: _write(procs, str(os.getpid()))

    def __exit__(self, *_):
        if self.path:
            os.rmdir(self.path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as stream:
        stream.write(text)


def in_memory_figures(args) -> dict:
    """The first `--in_memory_rows` rows as one file: loops-ctr's in-memory and streamed paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(args.work_dir, f"first_{args.in_memory_rows}.parquet")
    if not os.path.exists(path):
        columns = shard_columns(args.in_memory_rows, args.seed * 100_003)
        pq.write_table(pa.table(columns), path, row_group_size=GROUP_ROWS)
    limit, args.memory_limit_gb = args.memory_limit_gb, 0.0
    memory = run_ctr(path, os.path.join(args.work_dir, "run_memory"), args)
    streamed = run_ctr(path, os.path.join(args.work_dir, "run_streamed"), args, "--format=parquet")
    args.memory_limit_gb = limit
    return {
        "rows": args.in_memory_rows,
        "in_process": step_breakdown(path, args),
        "memory": memory,
        "streamed": streamed,
        "memory_over_streamed": round(memory["step_rows_per_s"] / streamed["step_rows_per_s"], 3)
        if not (memory["exit_code"] or streamed["exit_code"])
        else None,
    }


def step_breakdown(path: str, args, steps: int = 1000) -> dict:
    """Where a streamed step's time goes, in this process on the same rows and model: the
    Trainer's rows a second on batches cached in memory (the step alone), on the stream with
    every block read and prepared beforehand (the step and the stream's hand-over), and on
    the stream (the step, the hand-over and the reading and preparing)."""
    import keras
    import tensorflow as tf

    import loops
    from loops.input import (
        feature_streams,
        feature_tables,
        log_streams,
        sharded_logs,
        streaming_fit,
    )
    from loops_data.ctr_tables import features_of
    from loops_models import ctr

    log = sharded_logs.ShardedLog.open(path, file_format="parquet")
    split = streaming_fit.Split(*SPLIT)
    fitted = streaming_fit.fit_log(
        feature_tables.FeatureSpec.from_json(spec()), log, split.bands()["train"]
    )
    rows = feature_streams.FeatureLog(log, fitted, split)
    part = sharded_logs.LogPart(log, *split.bands()["train"])
    prepare = feature_streams.prepared(fitted)
    blocks = {b: prepare(part.read(b)) for b in range(len(log.blocks))}

    class Prepared(log_streams.Rows):
        def block(self, block, stats=None):
            return blocks[block]

    def stream(source):
        return log_streams.shuffled_log_batches(
            source, global_batch_size=args.batch, seed=args.seed,
            signature=feature_streams.signature(fitted),
        )  # fmt: skip

    first = list(stream(Prepared(part, prepare)).batches_from(0).take(100))
    widest = max(b[0]["tags"].shape[1] for b in first)

    def cached():
        def padded(*parts):
            return tf.stack([
                tf.pad(p, [[0, 0], [0, widest - p.shape[1]]], constant_values=-1)
                if p.shape.rank == 2 else p for p in parts
            ])  # fmt: skip

        return tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(padded, *first)
        ).repeat()  # fmt: skip

    sources = {
        "cached": cached,
        "prepared_stream": stream(Prepared(part, prepare)),
        "stream": rows.train_batches(global_batch_size=args.batch, seed=args.seed),
    }
    figures = {}
    for name, source in sources.items():
        trainer = loops.Trainer(
            loops.CTRLoop(
                model_fn=lambda: ctr.build_model(
                    "dcn_v2", ctr.CTRFeatures(**features_of(fitted)), seed=args.seed
                ),
                optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
                table_optimizer_fn=lambda: keras.optimizers.Adagrad(0.05),
                auc_examples=max(rows.row_counts()["test"], 1),
            ),
            strategy=loops.testing.replica_strategy(1),
            train_data=source,
            eval_data=rows.eval_batches("test", global_batch_size=args.batch),
            steps_per_loop=100,
            progress=loops.testing.quiet_progress(),
        )
        trainer.train(100)  # traced, and the stream's first window read
        started = time.perf_counter()
        trainer.train(100 + steps)
        figures[f"{name}_rows_per_s"] = round(steps * args.batch / (time.perf_counter() - started))
        trainer.close()
    for name in ("prepared_stream", "stream"):
        figures[f"cached_over_{name}"] = round(
            figures["cached_rows_per_s"] / figures[f"{name}_rows_per_s"], 3
        )
    return figures


def measure(args) -> dict:
    os.makedirs(args.work_dir, exist_ok=True)
    rows = []
    for count in args.rows:
        for file_format in args.formats:
            if file_format == "tfrecord" and count not in args.tfrecord_rows:
                continue
            folder = os.path.join(args.work_dir, f"{file_format}_{count}")
            started = time.perf_counter()
            write_log(folder, count, file_format, args.seed)
            row = {"rows": count, "format": file_format}
            row["write_s"] = round(time.perf_counter() - started, 1)
            row["array_gb"] = round(count * ARRAY_ROW_BYTES / 2**30, 2)
            row.update(input_figures(folder, args))
            model_dir = os.path.join(args.work_dir, f"run_{file_format}_{count}")
            row.update(run_ctr(folder, model_dir, args))
            if "step_rows_per_s" in row:
                row["input_over_step"] = round(row["input_rows_per_s"] / row["step_rows_per_s"], 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    first = {r["format"]: r.get("peak_rss_mb") for r in rows if r["rows"] == args.rows[0]}
    for row in rows:
        if first.get(row["format"]) and row.get("peak_rss_mb"):
            row["rss_over_first"] = round(row["peak_rss_mb"] / first[row["format"]], 3)
    return {
        "rows": rows,
        "in_memory": in_memory_figures(args) if args.in_memory_rows else None,
        "memory_limit_gb": args.memory_limit_gb,
        "peak_rss_of_this_process_mb": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    figures = measure(args)
    print(json.dumps(figures, indent=1))
    report.write(args, **figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
