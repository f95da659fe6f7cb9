"""The rows `loops-recommender` trains on when --data names shards (a directory, a glob, a
--format, or a Parquet, TFRecord or TSV file): an interaction log streamed in bounded memory
(`loops.input.interaction_streams`), split by a hash of each row's shard name and row number
(--split=random) or by a cut in time (--split=time), its ids numbered by one pass before
training (kept in the model_dir for a resume: `IDS_FILE`); the batches, baselines, test
figures, notes and identity a `SplitLog` gives of a log in memory, from passes over the shards.

What grows with the rows: nothing for the rating model (its baseline takes one pass a round);
the retrieval model's ranking evaluation holds the (user, item) pairs of the training and
evaluated rows, 8 bytes a row, to exclude each user's known items.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.input import interaction_baselines, sharded_logs
from loops.input.interaction_streams import FittedIds, InteractionLog
from loops_data.ctr_streams import SPLIT_WORDS, log_record, saved_pass

# A time split of a stream in words (results.json's "data": "split").
TIME_WORDS = (
    "by a cut in time: test the rows whose {column} is at or after {test_from} (about "
    "{test:g} of the rows){validation}"
)


def check_streamable(
    data: Mapping[str, Any], model: Mapping[str, Any], continue_from: str | None = None
) -> None:
    """Refuses what a streamed log cannot do, before any work: --user_history (a users x
    items table of every training row) and --continue_from (its ids grown by this log's)."""
    if continue_from:
        raise ValueError(
            f"--continue_from={continue_from} grows that run's ids by this log's, which a log "
            f"of shards (--data={data['data']}) does not do yet; pass --warm_start_from (its "
            "rows remapped by raw id), or give the log as one file read whole."
        )
    if model.get("user_history"):
        raise ValueError(
            "--user_history holds every user's training items in a users x items table, which "
            f"a log streamed from shards (--data={data['data']}) does not hold; pass "
            "--nouser_history, or give the log as one file read whole."
        )


@dataclasses.dataclass
class StreamedSplit:
    """A sharded interaction log and its split, with `SplitLog`'s methods."""

    rows: InteractionLog
    validation_fraction: float
    window_blocks: int
    basis: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What is read once and kept: each part's pairs, by part, and the bias baseline.
    _kept: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def train(self) -> FittedIds:
        """What the binary reads of the training rows: ids, counts and their sizes."""
        return self.rows.fitted

    @property
    def evaluated(self) -> str:
        return "validation" if self.validation_fraction else "test"

    def ids_file(self) -> str:
        """`IDS_FILE`'s text: the pass's ids and cuts with what they were fitted on."""
        cuts = self.rows.cuts
        return json.dumps(
            {
                "basis": self.basis,
                "cuts": None if cuts is None else dataclasses.asdict(cuts),
                "fitted": self.rows.fitted.to_json(),
            }
        )

    def mean_rating(self) -> float:
        return self.rows.fitted.mean_rating()

    def pairs(self, part: str) -> Any:
        """The (user, item) pairs of `part` in memory (read once, then kept)."""
        if part not in self._kept:
            self._kept[part] = self.rows.pairs(part)
        return self._kept[part]

    def known(self) -> Any:
        """The pairs a user's ranked test excludes: the training and validation rows'."""
        from loops_data.recommender_data import joined

        if not self.validation_fraction:
            return self.pairs("train")
        return joined(self.pairs("train"), self.pairs("validation"))

    def chunks(self, part: str):
        return lambda: self.rows.blocks(part)

    def bias(self) -> interaction_baselines.BiasBaseline:
        """The bias baseline fitted to the training rows (16 passes over them), once: the
        evaluation's baseline and the test's share it."""
        if "bias" not in self._kept:
            fitted = self.rows.fitted
            self._kept["bias"] = interaction_baselines.fit_bias_baseline_over(
                self.chunks("train"), num_users=fitted.num_users, num_items=fitted.num_items
            )
        return self._kept["bias"]

    def baselines(self, model: str, top_k: int) -> dict[str, float]:
        """The model's baseline on the evaluated rows (`SplitLog.baselines`)."""
        from loops_data import recommender_data

        if model == "retrieval":
            train = self.pairs("train")
            return recommender_data.popularity_baseline(train, self.pairs(self.evaluated), top_k)
        rmse = interaction_baselines.bias_rmse(self.bias(), self.rows.blocks(self.evaluated))
        return {"bias_baseline_rmse": rmse}

    def trainer_data(self, model: str, *, global_batch_size: int, seed: int) -> dict[str, Any]:
        """Streamed shuffled training batches, resumable at any batch, and one pass over the
        evaluated rows (retrieval: its users with their pairs, as `SplitLog`'s)."""
        from loops_data import recommender_data
        from loops_data.in_memory import batches_in_memory

        retrieval = model == "retrieval"
        train = self.rows.train_batches(
            with_ratings=not retrieval,
            global_batch_size=global_batch_size,
            seed=seed,
            window_blocks=self.window_blocks,
        )
        if retrieval:
            rows = recommender_data.ranking_eval_arrays(
                self.pairs("train"), self.pairs(self.evaluated)
            )
            return dict(
                train_data=train, eval_data=lambda: batches_in_memory(rows, global_batch_size)
            )
        evaluated = self.rows.eval_batches(self.evaluated, global_batch_size=global_batch_size)
        return dict(train_data=train, eval_data=evaluated)

    def test_figures(self, model: str, definition: Any, *, top_k: int) -> dict[str, Any]:
        """The trained definition's test figures and its baseline's (`SplitLog`'s)."""
        import tensorflow as tf

        from loops_data import recommender_data

        if model == "retrieval":
            return recommender_data.test_figures(
                model,
                definition,
                self.pairs("train"),
                self.known(),
                self.pairs("test"),
                top_k=top_k,
            )
        squares, pairs = 0.0, 0
        for users, items, ratings in self.rows.blocks("test"):
            scores = definition.score_pairs(tf.constant(users), tf.constant(items)).numpy()
            squares += float(np.sum((scores.astype(np.float64) - ratings.astype(np.float64)) ** 2))
            pairs += len(users)
        baseline = interaction_baselines.bias_rmse(self.bias(), self.rows.blocks("test"))
        return {
            "rmse": float(np.sqrt(squares / max(pairs, 1))),
            "pairs": pairs,
            "bias_baseline_rmse": baseline,
        }

    def notes(self) -> dict[str, Any]:
        log, fitted = self.rows.log, self.rows.fitted
        validation = (
            f"; validation {self.validation_fraction:g} of the rest"
            if self.validation_fraction
            else ""
        )
        test, cuts = self.rows.split.test_fraction, self.rows.cuts
        words = SPLIT_WORDS.format(test=test, validation=validation)
        if cuts is not None:
            words = TIME_WORDS.format(
                test=test,
                test_from=cuts.test_from,
                column=cuts.column,
                validation=(
                    f"; validation {self.validation_fraction:g} of the rest, at or after "
                    f"{cuts.validation_from}"
                    if self.validation_fraction
                    else ""
                ),
            )
        return {
            "source": f"{log.root}, {log.format}, {len(log.shards)} shards, {log.num_rows} rows "
            "(streamed)",
            "interactions": log.num_rows,
            "users": fitted.num_users,
            "items": fitted.num_items,
            "ratings": "implicit (1.0)" if self.rows.implicit else "explicit",
            "split": words,
            "train_interactions": fitted.rows["train"],
            **(
                {"validation_interactions": fitted.rows["validation"]}
                if self.validation_fraction
                else {}
            ),
            "test_interactions": fitted.rows["test"],
        }

    def identity(self, model: str, *, seed: int) -> dict[str, Any]:
        """The model kind, the shards and the split: what a resume must share."""
        from loops.input.log_identity import ids_sha256

        fitted, split = self.rows.fitted, self.rows.split
        return {
            "model": model,
            "log": {
                **log_record(self.rows.log),
                "users": fitted.num_users,
                "items": fitted.num_items,
                "user_ids_sha256": ids_sha256(fitted.user_ids),
                "item_ids_sha256": ids_sha256(fitted.item_ids),
            },
            "split": {
                "how": "hash" if self.rows.cuts is None else "time",
                "cuts": None if self.rows.cuts is None else dataclasses.asdict(self.rows.cuts),
                "test_fraction": split.test_fraction,
                "validation_fraction": split.validation_fraction,
                **{f"{part}_rows": count for part, count in fitted.rows.items()},
            },
        }


# In a model_dir: the ids the run's pass numbered, with what they were fitted on.
IDS_FILE = "streamed_ids.json"


def _basis(data: Mapping[str, Any], log: sharded_logs.ShardedLog) -> dict[str, Any]:
    """What a pass's ids were fitted on: the log's identity and the split."""
    split = [data["split"], data["test_fraction"], data["validation_fraction"]]
    return json.loads(json.dumps({"log": dict(log_record(log)), "split": split}))


def _saved(model_dir: str | None, basis: dict[str, Any]) -> Any:
    """The ids and cuts `IDS_FILE` in `model_dir` holds for `basis`, else None."""
    from loops.input.interaction_streams import TimeCuts

    def read(saved: dict[str, Any]) -> Any:
        cuts = None if saved["cuts"] is None else TimeCuts(**saved["cuts"])
        return FittedIds.from_json(saved["fitted"]), cuts

    return saved_pass(model_dir, IDS_FILE, basis, read)


def read_streamed(data: Mapping[str, Any], *, model_dir: str | None = None) -> StreamedSplit:
    """The sharded log `data` names (`loops_data.settings.INTERACTIONS`' values), indexed,
    its ids fitted (those a run in `model_dir` saved for the same log and split, `IDS_FILE`,
    read instead: a resume never repeats the pass) and split; a part left empty refused.

    Raises:
        ValueError: a log that cannot be indexed or read, or an empty part, with the fix.
    """
    from loops.input.streaming_fit import Split

    try:
        log = sharded_logs.ShardedLog.open(data["data"], file_format=data["format"])
        split = Split(data["test_fraction"], data["validation_fraction"])
        saved = _saved(model_dir, _basis(data, log))
        rows = InteractionLog(log, split, how=data["split"], fitted=saved)
    except ValueError as error:
        raise ValueError(f"{error} (--data={data['data']})") from None
    empty = [part for part, count in rows.fitted.rows.items() if not count]
    if not data["validation_fraction"]:
        empty = [part for part in empty if part != "validation"]
    if empty:
        raise ValueError(
            f"The split of {log.root} ({log.num_rows} rows) by --test_fraction="
            f"{data['test_fraction']} and --validation_fraction={data['validation_fraction']} "
            f"leaves no {' or '.join(empty)} rows; give more rows or larger fractions."
        )
    return StreamedSplit(
        rows, data["validation_fraction"], data["shuffle_window"], _basis(data, log)
    )
