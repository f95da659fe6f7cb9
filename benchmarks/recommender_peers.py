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
validation) beside them. With --refit every model is fitted again with the
settings it chose, on the training and validation rows together, before its
test (the issue's protocol: the peers' tuned figures were of such refits);
loops for as many epochs as its best step gave the training rows.

The peers come from an optional extra, never a dependency of loops:

    pip install -e '.[bench]'                    # scikit-surprise, implicit
    python -m benchmarks.recommender_peers       # about 5 minutes on 2 CPU cores
    python -m benchmarks.recommender_peers --recipes --refit   # RESULTS.md's table
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
    flags.DEFINE_bool(
        "refit",
        False,
        "Then fit each model again with the settings it chose, on the training and validation "
        "rows together (80,000), before its test figures: loops for the chosen best step's "
        "epochs (--validation_fraction=0 --eval_every=0), each peer with its chosen settings.",
    )


_HERE = os.path.dirname(os.path.abspath(__file__))

PEER_PACKAGES = {"surprise": "scikit-surprise", "implicit": "implicit"}
VALIDATION_FRACTION, K = 0.1, 10
# The settings each peer chooses among on the validation rows.
# Wide enough to hold the settings that did best in the issue's own tuning (SVD: 100 factors,
# 40 epochs, lr 0.01, reg 0.08; ALS: 32 factors, regularization 10, alpha 2).
SVD_GRID = {
    "n_factors": (50, 100),
    "reg_all": (0.02, 0.05, 0.08, 0.1, 0.15),
    "n_epochs": (20, 40),
    "lr_all": (0.005, 0.01),
}
ALS_GRID = {
    "factors": (32, 64, 128),
    "regularization": (0.01, 0.1, 1.0, 10.0),
    "alpha": (1.0, 2.0, 10.0),
}


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
    """Each part as DIRECTORY/PART.csv: user,item,rating,timestamp with the log's raw ids, and
    train_and_validation.csv (the rows a refit fits)."""
    os.makedirs(directory, exist_ok=True)
    every = {**parts, "train_and_validation": _joined(parts["train"], parts["validation"])}
    for name, part in every.items():
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


def surprise_peers(
    parts: dict[str, Interactions], split_dir: str, seed: int, refit: bool = False
) -> list[dict]:
    """BaselineOnly and SVD (Surprise) fitted to the train rows (read from loops' train.csv);
    SVD's settings chosen by validation RMSE; the test RMSE of each (with `refit`, of each
    fitted again with its settings to train_and_validation.csv)."""
    import surprise

    reader = surprise.Reader(
        line_format="user item rating timestamp", sep=",", skip_lines=1, rating_scale=(1, 5)
    )

    def rows_of(name):
        loaded = surprise.Dataset.load_from_file(os.path.join(split_dir, f"{name}.csv"), reader)
        return loaded.build_full_trainset()

    trainset = rows_of("train")
    final_set = rows_of("train_and_validation") if refit else trainset

    def fitted(algorithm, rows=trainset):
        algorithm.fit(rows)
        return lambda u, i: algorithm.predict(u, i, clip=False).est

    rows = []
    baseline = fitted(surprise.BaselineOnly(verbose=False), final_set)
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
    chosen = best[2]
    if refit:
        chosen = fitted(surprise.SVD(random_state=seed, **best[1]), final_set)
    rows.append(
        {"peer": "Surprise SVD", "settings": _words(best[1]), "validation_rmse": best[0],
         "rmse": _rmse(chosen, parts["test"])}
    )  # fmt: skip
    return rows


def _clicks(part: Interactions):
    """The part's (user, item) pairs as a users x items CSR matrix of ones."""
    import scipy.sparse

    clicks = scipy.sparse.csr_matrix(
        (np.ones(len(part), np.float32), (part.users, part.items)),
        shape=(part.num_users, part.num_items),
    )
    clicks.sum_duplicates()
    clicks.data[:] = 1.0
    return clicks


def implicit_peer(parts: dict[str, Interactions], seed: int, refit: bool = False) -> dict:
    """implicit's ALS on the train rows as clicks; settings chosen by validation Recall@10
    (with `refit`, fitted again with them to the train and validation rows before the test)."""
    from implicit.cpu.als import AlternatingLeastSquares

    train = parts["train"]
    known = _joined(train, parts["validation"])

    def fitted(settings, part):
        model = AlternatingLeastSquares(iterations=15, random_state=seed, num_threads=2, **settings)
        model.fit(_clicks(part), show_progress=False)
        return _dot_scores(model.user_factors, model.item_factors)

    best = None
    for values in itertools.product(*ALS_GRID.values()):
        settings = dict(zip(ALS_GRID, values, strict=True))
        scores = fitted(settings, train)
        score = interaction_baselines.ranking_metrics(scores, train, parts["validation"], k=K)
        if best is None or score[f"recall@{K}"] > best[0][f"recall@{K}"]:
            best = (score, settings, scores)
    assert best is not None
    scores = fitted(best[1], known) if refit else best[2]
    test = interaction_baselines.ranking_metrics(scores, known, parts["test"], k=K)
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


def train_loops(
    model: str, data: str, seed: int, recipe: bool = False, refit_rows: float | None = None
) -> dict:
    """Runs `loops-recommender --model=MODEL` with its defaults (or, with `recipe`, the flagfile
    benchmarks/movielens_MODEL.flags) on `data`: its results.json's best step, validation and
    test figures, and the seconds it took. With `refit_rows` (the training and validation rows
    over the training rows), then runs it again on the training and validation rows for the
    best step's epochs (`refit_steps`), and its test figures are that run's."""
    flags_file = [f"--flagfile={os.path.join(_HERE, f'movielens_{model}.flags')}"]
    command = [
        sys.executable, "-m", "loops.bin.recommender", *(flags_file if recipe else []),
        f"--data={data}", f"--seed={seed}", f"--model={model}",
    ]  # fmt: skip
    chosen, seconds = _binary_results(command)
    numbers = {
        "best_step": chosen["best_step"],
        "global_step": chosen["global_step"],
        "validation": chosen["validation"],
        "test": chosen["test"],
        "seconds": seconds,
    }
    if refit_rows is None:
        return numbers
    steps = refit_steps(chosen["best_step"], refit_rows)
    refit = ["--validation_fraction=0", "--eval_every=0", f"--train_steps={steps}"]
    refitted, refit_seconds = _binary_results([*command, *refit])
    # Without a validation split the run evaluates the test rows, once, at its end, beside
    # its baselines fitted to the same rows.
    return {
        **numbers,
        "refit_steps": steps,
        "test": refitted["eval"],
        "refit_seconds": refit_seconds,
    }


def refit_steps(best_step: int, rows_ratio: float) -> int:
    """The steps that give the training and validation rows as many epochs as `best_step` gave
    the training rows (the same batch size): best_step x rows_ratio, rounded."""
    return int(round(best_step * rows_ratio))


def _binary_results(command: list[str]) -> tuple[dict, float]:
    """`command` run with a fresh --model_dir: its results.json and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="peers-loops-") as model_dir:
        started = time.perf_counter()
        done = subprocess.run(
            [*command, f"--model_dir={model_dir}"], capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(model_dir, "results.json")) as stream:
            return json.load(stream), round(seconds, 1)


def table(numbers: dict) -> str:
    """One Markdown table: each model's test figures on loops' split."""
    rows = [
        "| model | settings (chosen on validation) | test RMSE | Recall@10 | NDCG@10 |",
        "| --- | --- | --- | --- | --- |",
    ]
    rating, retrieval = numbers["loops"]["rating"], numbers["loops"]["retrieval"]
    settings = numbers.get("loops_settings", "defaults")
    rows.append(
        f"| loops rating ({settings}) | {_chosen_step(rating)} | {rating['test']['rmse']:.4f} "
        "| - | - |"
    )
    rows.append(f"| loops bias baseline | - | {rating['test']['bias_baseline_rmse']:.4f} | - | - |")
    for peer in numbers.get("peers", []):
        rmse = f"{peer['rmse']:.4f}" if "rmse" in peer else "-"
        ranking = f"{peer['recall']:.4f} | {peer['ndcg']:.4f}" if "recall" in peer else "- | -"
        rows.append(f"| {peer['peer']} | {peer['settings']} | {rmse} | {ranking} |")
    test = retrieval["test"]
    rows.append(
        f"| loops retrieval ({settings}) | {_chosen_step(retrieval)} | - | "
        f"{test[f'recall_at_{K}']:.4f} | "
        f"{test[f'ndcg_at_{K}']:.4f} |"
    )
    rows.append(
        f"| popularity | - | - | {test[f'popularity_recall_at_{K}']:.4f} | "
        f"{test[f'popularity_ndcg_at_{K}']:.4f} |"
    )
    return "\n".join(rows)


def _chosen_step(run: dict) -> str:
    said = f"best step {run['best_step']} of {run['global_step']}"
    if "refit_steps" in run:
        said += f", refit for {run['refit_steps']} steps on train + validation"
    return said


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
            *surprise_peers(parts, split_dir, FLAGS.seed, FLAGS.refit),
            implicit_peer(parts, FLAGS.seed, FLAGS.refit),
        ]
    numbers["loops_settings"] = "the recipe" if FLAGS.recipes else "defaults"
    rows_ratio = (len(parts["train"]) + len(parts["validation"])) / len(parts["train"])
    numbers["loops"] = {
        model: train_loops(
            model, path, FLAGS.seed, FLAGS.recipes, rows_ratio if FLAGS.refit else None
        )
        for model in ("rating", "retrieval")
    }
    print(table(numbers))
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
