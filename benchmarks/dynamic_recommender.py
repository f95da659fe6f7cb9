"""MovieLens-100K through `loops-recommender --dynamic_ids`: dynamic user and item tables with room
for every id against static tables started alike, and smaller dynamic tables beside them.

Takes ml-100k.inter out of the recbole==1.2.1 wheel into the cache
(`benchmarks.movielens_data`), then trains the rating recipe
(`movielens_rating.flags` beside this file) with every table trained by Adagrad
rows (`--table_optimizer=adagrad`), each run a process of its own:

- static: `--placed_tables --rows_by_id`, loops.EmbeddingTables whose rows start by id;
- dynamic, every id: `--dynamic_ids` (a capacity of every id of the log, nothing evicted);
- dynamic, smaller: `--dynamic_ids --id_capacity=N` (users and items compete for N rows);
- dynamic, admitted after 2 sightings: `--dynamic_ids --id_admit_after=2`.

It prints each run's validation RMSE at every evaluation, the test RMSE of its
best checkpoint, and the test RMSE over the pairs whose user and item both
occur in the training rows (scored by each run's export): a dynamic table gives
an id it never trained zeros, where a static table keeps the id's initial
row, so only pairs of ids trained can be equal. The comparison lines give the
largest difference of the every-id dynamic run from the static one.

    python -m benchmarks.dynamic_recommender                  # about 15 minutes on 2 CPU cores
    python -m benchmarks.dynamic_recommender --steps=300 --output=dynamic_ml100k.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np
from absl import app, flags

from benchmarks import movielens, movielens_data

FLAGS = flags.FLAGS
_HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE = f"--flagfile={os.path.join(_HERE, 'movielens_rating.flags')}"
ROW_RULE = ("--table_optimizer=adagrad", "--table_learning_rate=0.05")


def define_flags() -> None:
    """This program's flags and movielens_data's (--cache_dir, --seed, --output)."""
    movielens_data.define_flags()
    flags.DEFINE_integer("steps", 3000, "Train steps of each run.")
    flags.DEFINE_integer("capacity", 500, "The rows of each table of the smaller dynamic run.")


def runs(capacity: int) -> dict[str, tuple[str, ...]]:
    """Each run's flags beside the recipe, the row rule, --data, --seed and --model_dir."""
    return {
        "static, rows by id": ("--placed_tables", "--rows_by_id"),
        "dynamic, every id": ("--dynamic_ids",),
        f"dynamic, {capacity} rows a table": ("--dynamic_ids", f"--id_capacity={capacity}"),
        "dynamic, admitted after 2": ("--dynamic_ids", "--id_admit_after=2"),
    }


def binary_split(data: str, seed: int):
    """The log split as the binary splits it with the recipe's settings (`read_split`)."""
    from loops_data import recommender_data

    return recommender_data.read_split(
        {"data": data, "split": "random", "test_fraction": 0.2, "validation_fraction": 0.1},
        seed=seed,
    )


def trained_pairs_rmse(export_dir: str, log) -> dict[str, float]:
    """The export's test RMSE over every test pair of the split `log` and over those whose
    user and item both occur in its training rows."""
    import tensorflow as tf

    train, test = log.train, log.test
    trained = np.isin(test.users, train.users) & np.isin(test.items, train.items)
    served = tf.saved_model.load(export_dir).signatures["score_pairs"]
    scores = served(
        users=tf.constant(train.user_ids[test.users]), items=tf.constant(train.item_ids[test.items])
    )["scores"].numpy()
    error = scores.astype(np.float64) - test.ratings.astype(np.float64)
    return {
        "test_rmse_served": float(np.sqrt(np.mean(error**2))),
        "test_rmse_trained_pairs": float(np.sqrt(np.mean(error[trained] ** 2))),
        "trained_pairs": int(trained.sum()),
        "test_pairs": len(test),
    }


def train(name: str, extra: tuple[str, ...], data: str, steps: int, seed: int, log) -> dict:
    """One run of `loops-recommender`: its figures, its tables' counters and its seconds."""
    with tempfile.TemporaryDirectory(prefix="dynamic-ml100k-") as model_dir:
        flags = [RECIPE, *ROW_RULE, *extra, f"--data={data}", f"--seed={seed}"]
        flags += [f"--train_steps={steps}", f"--eval_every={max(steps // 10, 1)}"]
        try:
            results, seconds = movielens.run_recommender(flags, model_dir)
        except RuntimeError as error:
            raise RuntimeError(f"{name}: {error}") from None
        return {
            "flags": list(extra),
            "validation_rmse": [entry["rmse"] for entry in results["history"]],
            "test_rmse": results["test"]["rmse"],
            "best_step": results["best_step"],
            **trained_pairs_rmse(os.path.join(model_dir, "export"), log),
            "tables": {t["name"]: t.get("dynamic") for t in results["tables"]},
            "seconds": round(seconds, 1),
        }


def report(numbers: dict) -> str:
    """The figures as a Markdown table and the comparison lines."""
    lines = [
        "| run | best validation RMSE | test RMSE | test RMSE, trained pairs | resident "
        "users / items | evictions (user table) | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, run in numbers["runs"].items():
        users, items = run["tables"].get("user_table"), run["tables"].get("item_table")
        resident = f"{users['resident']} / {items['resident']}" if users else "-"
        evicted = users["evictions"] if users else "-"
        lines.append(
            f"| {name} | {min(run['validation_rmse']):.4f} | {run['test_rmse']:.4f} | "
            f"{run['test_rmse_trained_pairs']:.4f} | {resident} | {evicted} | {run['seconds']} |"
        )
    static, dynamic = (numbers["runs"][name] for name in list(numbers["runs"])[:2])
    history = np.abs(np.subtract(dynamic["validation_rmse"], static["validation_rmse"]))
    lines += [
        "",
        f"dynamic (every id) - static: validation RMSE at every evaluation differs by at most "
        f"{history.max():.2e}; test RMSE over the trained pairs by "
        f"{abs(dynamic['test_rmse_trained_pairs'] - static['test_rmse_trained_pairs']):.2e}; "
        f"over every test pair by {abs(dynamic['test_rmse'] - static['test_rmse']):.2e} "
        f"({static['test_pairs'] - static['trained_pairs']} of {static['test_pairs']} test "
        "pairs hold an id the training rows never hold)",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    del argv
    try:
        path = movielens_data.ml_100k_path(FLAGS.cache_dir)
    except (ValueError, RuntimeError) as error:
        sys.exit(f"dynamic_recommender: {error}")
    log = binary_split(path, FLAGS.seed)  # read once, for every run's trained pairs
    numbers = {
        "recipe": [RECIPE.split("/")[-1], *ROW_RULE],
        "runs": {
            name: train(name, extra, path, FLAGS.steps, FLAGS.seed, log)
            for name, extra in runs(FLAGS.capacity).items()
        },
    }
    print(report(numbers))
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
