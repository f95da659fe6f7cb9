"""MovieLens-100K side by side: `loops-recommender` (its defaults, or its recipes) beside
Surprise and implicit on loops' own split, each figure by loops' definitions.

Splits ml-100k.inter (`benchmarks.movielens_data`) as the binary does: a
random 80/20 train/test split, then a random 10% of the training rows for
validation (--seed). Writes the three parts as CSV (raw ids) into
--split_dir, fits the peers on the training rows left (as loops trains
on them), chooses each peer's settings by its validation figure (never the
test rows), and reports the test figures of the chosen ones: Surprise's
BaselineOnly and SVD by RMSE, implicit's ALS by Recall@10 and NDCG@10 with
`loops.input.interaction_baselines` (relevant = a user's test items less
their known ones; ranked over all items, known items excluded; NDCG over the
ideal DCG of min(count, 10)). Then it runs the binary (--model=rating,
then --model=retrieval, defaults otherwise; with --recipes the flagfiles
movielens_rating.flags and movielens_retrieval.flags beside this file) and prints one table with
loops' test figures (results.json's "test": the best checkpoint by
validation) beside them.

The peers come from an optional extra, never a dependency of loops:

    pip install -e '.[bench]'                    # scikit-surprise, implicit
    python -m benchmarks.recommender_peers       # about 5 minutes on 2 CPU cores
"""

from __future__ import annotations

import csv
import importlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from absl import app, flags

from benchmarks import movielens_data
from loops.input import interaction_baselines, interaction_logs
from loops.input.interaction_logs import Interactions

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines this program's flags and movielens_data's (--cache_dir, --seed, --output);
    when it runs, never at import (see movielens_data.define_flags)."""
    movielens_data.define_flags()
    flags.DEFINE_string("split_dir", None, "Where loops' split is written (default: a temp dir).")
    flags.DEFINE_bool("peers", True, "Fit the peers (false: loops' figures only).")
    flags.DEFINE_bool(
        "recipes",
        False,
        "Train loops with the recipes benchmarks/movielens_rating.flags and "
        "movielens_retrieval.flags (chosen on the validation rows) instead of its defaults.",
    )


_HERE = os.path.dirname(os.path.abspath(__file__))

PEER_PACKAGES = {"surprise": "scikit-surprise", "implicit": "implicit"}
VALIDATION_FRACTION, K = 0.1, 10
# The settings each peer chooses among on the validation rows.
SVD_GRID = {"n_factors": (50, 100), "reg_all": (0.02, 0.05, 0.1), "n_epochs": (20, 40)}
ALS_GRID = {"factors": (32, 64, 128), "regularization": (0.01, 0.1, 1.0), "alpha": (1.0, 10.0)}


def missing_peers() -> list[str]:
    """The pip names of the peer packages this Python cannot import."""
    missing = []
    for module, pip in PEER_PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(pip)
    return missing


def loops_split(path: str, seed: int) -> dict[str, Interactions]:
    """train (the rows left), validation and test: the binary's split of the log."""
    log = interaction_logs.read_interactions(path)
    train, test = interaction_logs.split(log, how="random", test_fraction=0.2, seed=seed)
    train, validation = interaction_logs.split_validation(
        train, how="random", validation_fraction=VALIDATION_FRACTION, seed=seed
    )
    return {"train": train, "validation": validation, "test": test}


def write_split(parts: dict[str, Interactions], directory: str) -> None:
    """Each part as DIRECTORY/PART.csv: user,item,rating,timestamp with the log's raw ids."""
    os.makedirs(directory, exist_ok=True)
    for name, part in parts.items():
        with open(os.path.join(directory, f"{name}.csv"), "w", newline="") as stream:
            writer = csv.writer(stream)
            writer.writerow(["user", "item", "rating", "timestamp"])
            writer.writerows(
                zip(
                    part.user_ids[part.users].tolist(),
                    part.item_ids[part.items].tolist(),
                    part.ratings.tolist(),
                    part.timestamps.tolist(),
                    strict=True,
                )
            )


def _rmse(predict: Callable[[str, str], float], part: Interactions) -> float:
    users, items = part.user_ids[part.users].tolist(), part.item_ids[part.items].tolist()
    predicted = np.array([predict(str(u), str(i)) for u, i in zip(users, items, strict=True)])
    return float(np.sqrt(np.mean((predicted - part.ratings.astype(np.float64)) ** 2)))


def surprise_peers(parts: dict[str, Interactions], split_dir: str, seed: int) -> list[dict]:
    """BaselineOnly and SVD (Surprise) fitted to the train rows (read from loops' train.csv);
    SVD's settings chosen by validation RMSE; the test RMSE of each."""
    import surprise

    reader = surprise.Reader(
        line_format="user item rating timestamp", sep=",", skip_lines=1, rating_scale=(1, 5)
    )
    trainset = surprise.Dataset.load_from_file(os.path.join(split_dir, "train.csv"), reader)
    trainset = trainset.build_full_trainset()

    def fitted(algorithm):
        algorithm.fit(trainset)
        return lambda u, i: algorithm.predict(u, i, clip=False).est

    rows = []
    baseline = fitted(surprise.BaselineOnly(verbose=False))
    rows.append(
        {"peer": "Surprise BaselineOnly", "settings": "defaults (ALS biases)",
         "rmse": _rmse(baseline, parts["test"])}
    )  # fmt: skip
    best = None
    for values in itertools.product(*SVD_GRID.values()):
        settings = dict(zip(SVD_GRID, values, strict=True))
        predict = fitted(surprise.SVD(random_state=seed, **settings))
        score = _rmse(predict, parts["validation"])
        if best is None or score < best[0]:
            best = (score, settings, predict)
    assert best is not None
    rows.append(
        {"peer": "Surprise SVD", "settings": _words(best[1]), "validation_rmse": best[0],
         "rmse": _rmse(best[2], parts["test"])}
    )  # fmt: skip
    return rows


def implicit_peer(parts: dict[str, Interactions], seed: int) -> dict:
    """implicit's ALS on the train rows as clicks; settings chosen by validation Recall@10."""
    import scipy.sparse
    from implicit.cpu.als import AlternatingLeastSquares

    train = parts["train"]
    clicks = scipy.sparse.csr_matrix(
        (np.ones(len(train), np.float32), (train.users, train.items)),
        shape=(train.num_users, train.num_items),
    )
    clicks.sum_duplicates()
    clicks.data[:] = 1.0
    known = _joined(train, parts["validation"])
    best = None
    for values in itertools.product(*ALS_GRID.values()):
        settings = dict(zip(ALS_GRID, values, strict=True))
        model = AlternatingLeastSquares(iterations=15, random_state=seed, num_threads=2, **settings)
        model.fit(clicks, show_progress=False)
        scores = _dot_scores(model.user_factors, model.item_factors)
        score = interaction_baselines.ranking_metrics(scores, train, parts["validation"], k=K)
        if best is None or score[f"recall@{K}"] > best[0][f"recall@{K}"]:
            best = (score, settings, scores)
    assert best is not None
    test = interaction_baselines.ranking_metrics(best[2], known, parts["test"], k=K)
    return {
        "peer": "implicit ALS",
        "settings": _words(best[1]) + ", 15 iterations",
        "validation_recall": best[0][f"recall@{K}"],
        "recall": test[f"recall@{K}"],
        "ndcg": test[f"ndcg@{K}"],
    }


def _dot_scores(users: np.ndarray, items: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    users, items = np.asarray(users, np.float64), np.asarray(items, np.float64)
    return lambda rows: users[rows] @ items.T


def _joined(first: Interactions, second: Interactions) -> Interactions:
    return interaction_logs.Interactions(
        users=np.concatenate([first.users, second.users]),
        items=np.concatenate([first.items, second.items]),
        ratings=np.concatenate([first.ratings, second.ratings]),
        timestamps=np.concatenate([first.timestamps, second.timestamps]),
        num_users=first.num_users,
        num_items=first.num_items,
        user_ids=first.user_ids,
        item_ids=first.item_ids,
    )


def _words(settings: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in settings.items())


def train_loops(model: str, data: str, seed: int, recipe: bool = False) -> dict:
    """Runs `loops-recommender --model=MODEL` with its defaults (or, with `recipe`, the flagfile
    benchmarks/movielens_MODEL.flags) on `data`: its results.json's best step, validation and
    test figures, and the seconds it took."""
    recipe_flags = [f"--flagfile={os.path.join(_HERE, f'movielens_{model}.flags')}"]
    with tempfile.TemporaryDirectory(prefix=f"peers-{model}-") as model_dir:
        command = [
            sys.executable, "-m", "loops.bin.recommender", *(recipe_flags if recipe else []),
            f"--data={data}", f"--seed={seed}", f"--model_dir={model_dir}", f"--model={model}",
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(model_dir, "results.json")) as stream:
            results = json.load(stream)
    return {
        "best_step": results["best_step"],
        "global_step": results["global_step"],
        "validation": results["validation"],
        "test": results["test"],
        "seconds": round(seconds, 1),
    }


def table(numbers: dict) -> str:
    """One Markdown table: each model's test figures on loops' split."""
    rows = [
        "| model | settings (chosen on validation) | test RMSE | Recall@10 | NDCG@10 |",
        "| --- | --- | --- | --- | --- |",
    ]
    rating, retrieval = numbers["loops"]["rating"], numbers["loops"]["retrieval"]
    settings = numbers.get("loops_settings", "defaults")
    rows.append(
        f"| loops rating ({settings}) | best step {rating['best_step']} of "
        f"{rating['global_step']} | {rating['test']['rmse']:.4f} | - | - |"
    )
    rows.append(f"| loops bias baseline | - | {rating['test']['bias_baseline_rmse']:.4f} | - | - |")
    for peer in numbers.get("peers", []):
        rmse = f"{peer['rmse']:.4f}" if "rmse" in peer else "-"
        ranking = f"{peer['recall']:.4f} | {peer['ndcg']:.4f}" if "recall" in peer else "- | -"
        rows.append(f"| {peer['peer']} | {peer['settings']} | {rmse} | {ranking} |")
    test = retrieval["test"]
    rows.append(
        f"| loops retrieval ({settings}) | best step {retrieval['best_step']} of "
        f"{retrieval['global_step']} | - | {test[f'recall_at_{K}']:.4f} | "
        f"{test[f'ndcg_at_{K}']:.4f} |"
    )
    rows.append(
        f"| popularity | - | - | {test[f'popularity_recall_at_{K}']:.4f} | "
        f"{test[f'popularity_ndcg_at_{K}']:.4f} |"
    )
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    del argv
    missing = missing_peers()
    if FLAGS.peers and missing:
        sys.exit(
            f"recommender_peers: the peers need {', '.join(PEER_PACKAGES.values())}, and "
            f"this Python lacks {', '.join(missing)}; install them with "
            "pip install -e '.[bench]' (never a dependency of loops), or pass --nopeers for "
            "loops' figures only."
        )
    try:
        path = movielens_data.ml_100k_path(FLAGS.cache_dir)
    except (ValueError, RuntimeError) as error:
        sys.exit(f"recommender_peers: {error}")
    parts = loops_split(path, FLAGS.seed)
    split_dir = FLAGS.split_dir or tempfile.mkdtemp(prefix="loops-split-")
    write_split(parts, split_dir)
    print(f"loops' split in {split_dir}: " + ", ".join(f"{n} {len(p)}" for n, p in parts.items()))
    numbers: dict = {"split_dir": split_dir}
    if FLAGS.peers:
        numbers["peers"] = [
            *surprise_peers(parts, split_dir, FLAGS.seed),
            implicit_peer(parts, FLAGS.seed),
        ]
    numbers["loops_settings"] = "the recipe" if FLAGS.recipes else "defaults"
    numbers["loops"] = {
        model: train_loops(model, path, FLAGS.seed, FLAGS.recipes)
        for model in ("rating", "retrieval")
    }
    print(table(numbers))
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
