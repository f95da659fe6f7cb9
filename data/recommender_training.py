"""A recommender's training as `loops-recommender` sets it up, from plain values, so a Python
user reaches each part of it (`RecommenderTraining`): the settings it fills in, the log read and
split, the checks of top K and of the model's size, the refusal of a model_dir trained on other
data, the RetrievalLoop or RatingLoop over `loops_models.recommender` with its baseline, and
its ids.json, kept best model's test and export, which serve the log's own ids.

Nothing here imports TensorFlow when loaded: the binary imports it before TensorFlow starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loops_models import settings as model_settings

if TYPE_CHECKING:
    from loops.input.interaction_logs import Interactions
    from loops_data.recommender_data import SplitLog

# What the export's signatures take and give (`loops.cli.flags.binary_arguments`' signature).
SIGNATURE = (
    "the log's user ids -> items, scores, known_user (top K); "
    "score_pairs: users, items -> scores, known_user, known_item"
)

# () -> (a loop's optimizer_fn, (its keras tables' table_optimizer_fn, its placed tables'
# optimizer_fn)), either of the two None: `loops.bin.training_settings.optimizer_fn` and
# `table_optimizer_fns`.
Optimizers = Callable[[], tuple[Callable[[], Any], tuple[Any, Any]]]


def check_top_k(top_k: int, train: Interactions) -> None:
    """Refuses a top_k the export cannot return (both models), before any training.

    Raises:
        ValueError: top_k is more than the log's items.
    """
    if top_k > train.num_items:
        raise ValueError(
            f"--top_k={top_k} is more than the {train.num_items} items of the log "
            f"({train.source}), and the export returns a user's top K of them; pass "
            f"--top_k={train.num_items} or less."
        )


def _ids_of(source: str, flag: str) -> dict[str, Any]:
    """The ids.json of the run in `source` (`loops.model_dir.id_vocabulary.read_ids`).

    Raises:
        ValueError: it holds none, naming --`flag`, the value and the fix.
    """
    from loops.model_dir import id_vocabulary

    try:
        return id_vocabulary.read_ids(source)
    except OSError as error:
        raise ValueError(
            f"--{flag}={source!r} holds no {id_vocabulary.ID_FILE} ({error}): it is not the "
            "model_dir of a loops-recommender run, whose ids it needs to give each user and "
            "item its row; pass such a model_dir."
        ) from None


def check_dynamic_ids(
    model: Mapping[str, Any],
    table_optimizer: str,
    strategy: str = "default",
    replicas: int = 1,
    parameter_server_mode: str = "exact",
) -> None:
    """Refuses --dynamic_ids whose tables would have no row rule, or a strategy a
    `loops.DynamicTable` cannot train under (`loops.tables.dynamic_tables`), before
    TensorFlow loads.

    Raises:
        ValueError: --dynamic_ids with --table_optimizer=same, the asynchronous
            parameter-server mode, or --strategy=central_storage on several replicas.
    """
    if not model["dynamic_ids"]:
        return
    if strategy == "parameter_server" and parameter_server_mode == "async":
        raise ValueError(
            "--dynamic_ids cannot train under --parameter_server_mode=async: a dynamic table "
            "decides each step's admissions from the whole step's ids, and the asynchronous "
            "workers take their steps apart; pass --parameter_server_mode=exact (the chief "
            "decides each step before its workers compute it: the same numbers as one "
            "process), or drop --dynamic_ids."
        )
    if strategy == "central_storage" and replicas > 1:
        raise ValueError(
            f"--dynamic_ids cannot train under --strategy={strategy}: a dynamic table decides "
            "each step's admissions from the whole step's ids on every replica, which "
            "central storage's one copy of several replicas' tables cannot do; pass "
            "--strategy=mirrored or multi_worker_mirrored (the same numbers), or drop "
            "--dynamic_ids."
        )
    if table_optimizer == "same":
        raise ValueError(
            "--dynamic_ids makes each user and item table a loops.DynamicTable, which trains "
            "its rows by a row rule of its own, and --table_optimizer=same would train them "
            "with --optimizer: pass --table_optimizer=adagrad, rowwise_adagrad or sgd (with "
            "--table_learning_rate), or drop --dynamic_ids."
        )


class RecommenderTraining:
    """A RetrievalLoop's or RatingLoop's training on an interaction log, as loops-recommender
    sets it up. The log is read once, when it is first needed (`read`): the export and the
    actions (`outputs`), made before it for a Trainer's arguments, read it when
    training starts or ends.

    Args:
        model: `loops_models.settings.RECOMMENDER`'s values (model: retrieval or rating,
            embedding_dim, top_k, user_history, ...).
        data: `loops_data.settings.INTERACTIONS`' values (data: the log's file or shards,
            None for the generated log; split; test_fraction; validation_fraction; format and
            shuffle_window, for shards).
        seed: the generated log's, the split's, the weights' and the batches' seed.
        global_batch_size: the rows of a training batch and of an eval batch.
        optimizers: () -> the loop's optimizers (`Optimizers`), called once the log is read
            and checked.
        weight_copies: the copies of every weight training holds (the weights and the
            optimizer's slots), for the check of the model's size against memory.
        clip_norm: the loop's gradient clipping; None for its default.
        warm_start: `loops.bin.training_settings.WARM_START`'s values (warm_start_from:
            another run's model_dir or None; warm_start_variables: a pattern of names;
            continue_from: the model_dir of a run of this model to go on from, or None).
        model_dir: the run's model_dir, where a log of shards' id pass is kept for a resume
            (`loops_data.recommender_streams.IDS_FILE`); None: none kept.
    """

    def __init__(
        self,
        model: Mapping[str, Any],
        data: Mapping[str, Any],
        *,
        seed: int,
        global_batch_size: int,
        optimizers: Optimizers,
        weight_copies: int = 1,
        clip_norm: float | None = None,
        warm_start: Mapping[str, Any] | None = None,
        model_dir: str | None = None,
    ):
        self.model, self.data = dict(model), dict(data)
        self.model_dir = model_dir
        self.warm_start_values = dict(warm_start or {})
        self.seed, self.global_batch_size = seed, global_batch_size
        self.optimizers, self.weight_copies = optimizers, weight_copies
        self.loop_options = {} if clip_norm is None else {"clip_norm": clip_norm}
        self._log: SplitLog | Any = None
        from loops_data.ctr_streams import names_shards

        # A log of shards streams (`loops_data.recommender_streams`); a file is read whole.
        data_path, data_format = self.data["data"], self.data.get("format")
        self.streamed = names_shards(data_path, data_format) or str(data_path or "").endswith(
            (".parquet", ".parq", ".pq")
        )

    def filled_in(self, keep_best_metric: str | None) -> dict[str, Any]:
        """The settings loops-recommender fills in before training: a relative `data` as the
        absolute path it names from here (config.json records the file the run reads, and an
        evaluator started elsewhere takes that file, not its own); with a validation split
        and no `keep_best_metric`, the model's own metric kept best: rmse (min) for rating,
        recall_at_K (max) for retrieval."""
        filled: dict[str, Any] = {}
        if self.data["data"] is not None:
            filled["data"] = os.path.abspath(self.data["data"])
        if self.data["validation_fraction"] and keep_best_metric is None:
            if self.model["model"] == "retrieval":
                best = {
                    "keep_best_metric": f"recall_at_{self.model['top_k']}",
                    "keep_best_mode": "max",
                }
            else:
                best = {"keep_best_metric": "rmse", "keep_best_mode": "min"}
            filled.update(best)
        return filled

    def check_streamable(self) -> None:
        """Refuses, before any work, what a log of shards cannot do
        (`loops_data.recommender_streams.check_streamable`); a file read whole passes."""
        if self.streamed:
            from loops_data import recommender_streams

            recommender_streams.check_streamable(
                self.data, self.model, self.warm_start_values.get("continue_from")
            )

    def read(self) -> Any:
        """The log read and split, once (a `loops_data.recommender_data.SplitLog`, or a
        `loops_data.recommender_streams.StreamedSplit` of a log of shards); a top K
        the export cannot return (`check_top_k`) or a model whose weights cannot fit in this
        machine's memory (`loops_models.settings.check_recommender_fits`) refused, before
        any training.

        Raises:
            ValueError: the log, its split, the top K or the model's size, with the fix.
        """
        if self._log is None:
            from loops_data import recommender_data

            log: Any
            if self.streamed:
                from loops_data import recommender_streams

                self.check_streamable()
                log = recommender_streams.read_streamed(self.data, model_dir=self.model_dir)
            else:
                log = recommender_data.read_split(
                    self.data, seed=self.seed, grown_from=self.grown_from()
                )
            check_top_k(self.model["top_k"], log.train)
            model_settings.check_recommender_fits(
                self.model,
                num_users=log.train.num_users,
                num_items=log.train.num_items,
                copies=self.weight_copies,
            )
            self._log = log
        return self._log

    def identity(self) -> dict[str, Any]:
        """The model kind, log and split this training reads (`loops.input.log_identity`):
        what a run in a model_dir must share to go on from its checkpoints."""
        from loops.input import log_identity

        log = self.read()
        if self.streamed:
            return log.identity(self.model["model"], seed=self.seed)
        return log_identity.identity(
            self.model["model"],
            log.interactions,
            log.train,
            log.test,
            path=self.data["data"],
            how=self.data["split"],
            test_fraction=self.data["test_fraction"],
            seed=self.seed,
            validation=log.validation,
            validation_fraction=self.data["validation_fraction"],
        )

    def outputs(self, keep_best_metric: str | None) -> dict[str, Any]:
        """What this training adds to a Trainer (`loops.cli.flags.binary_arguments`'
        keywords): its export (`export`, serving `SIGNATURE`) and its own actions: ids.json
        as training starts; with a validation split and a `keep_best_metric`, the best model
        restored and tested once on the test rows when training ends (`test_figures`, before
        the export, which comes after these)."""
        from loops.model_dir import id_vocabulary
        from loops.run.actions import WriteRunFile
        from loops.run.best_checkpoint import RestoreBestOnEnd

        def ids_json() -> str:
            train = self.read().train
            return id_vocabulary.ids_json(train.user_ids, train.item_ids)

        actions: list = [WriteRunFile(id_vocabulary.ID_FILE, ids_json)]
        if self.streamed:
            from loops_data.recommender_streams import IDS_FILE

            actions.append(WriteRunFile(IDS_FILE, lambda: self.read().ids_file()))
        if self.data["validation_fraction"] and keep_best_metric:
            actions.append(RestoreBestOnEnd(self.test_figures))
        return {"export": self.export, "signature": SIGNATURE, "actions": actions}

    def test_figures(self, definition: Any) -> dict[str, Any]:
        """The trained `definition`'s figures on the test rows, each user's train and
        validation items known (`loops_data.recommender_data.test_figures`)."""
        return self.read().test_figures(self.model["model"], definition, top_k=self.model["top_k"])

    def export(self, definition: Any, export_dir: str) -> str:
        """Exports the trained `definition`'s model to `export_dir`, serving the log's own ids
        (`loops.model_dir.recommender_export.export_recommender`); returns export_dir."""
        from loops.model_dir.recommender_export import export_recommender

        train = self.read().train
        return export_recommender(
            definition.model,
            export_dir,
            score_all_items=definition.score_all_items,
            score_pairs=definition.score_pairs,
            top_k=self.model["top_k"],
            user_ids=train.user_ids,
            item_ids=train.item_ids,
            item_counts=train.item_counts(),
        )

    def definition(self, optimizer_fn: Callable[[], Any], tables: tuple[Any, Any]) -> Any:
        """The RetrievalLoop or RatingLoop of the settings over the log's training rows,
        evaluated on its validation rows (its test rows without), with its baseline beside;
        `tables`: (its keras tables' table_optimizer_fn, its placed tables' optimizer_fn)."""
        log = self.read()
        common = dict(
            optimizer_fn=optimizer_fn,
            table_optimizer_fn=tables[0],
            num_items=log.train.num_items,
            data_notes=log.notes(),
            baselines=log.baselines(self.model["model"], self.model["top_k"]),
            **self.loop_options,
        )
        placed = tables[1]
        if self.model["dynamic_ids"]:
            # Each dynamic table trains by its own row rule: the tables' optimizer, whichever
            # --placed_tables says it goes to.
            placed = tables[1] if tables[1] is not None else tables[0]
            common["table_optimizer_fn"] = None
            if placed is None:
                check_dynamic_ids(self.model, "same")
        build = self._retrieval if self.model["model"] == "retrieval" else self._rating
        return build(log, placed, common)

    def _tables(self, train: Interactions) -> dict[str, Any]:
        """The id tables' keywords of `loops_models.recommender`'s builders: the log's raw ids
        with --rows_by_id or --dynamic_ids, and the dynamic tables' capacity and policy."""
        model = self.model
        if not (model["dynamic_ids"] or model["rows_by_id"]):
            return {}
        dynamic = None
        if model["dynamic_ids"]:
            dynamic = {"capacity": model["id_capacity"], "admit_after": model["id_admit_after"]}
        return {"user_ids": train.user_ids, "item_ids": train.item_ids, "dynamic": dynamic}

    def grown_from(self) -> dict[str, Any] | None:
        """The ids of the run --continue_from names (its ids.json), which this run's ids grow
        (`loops_data.recommender_data.read_split`); None without one.

        Raises:
            ValueError: that run has no ids.json, or it does not read.
        """
        source = self.warm_start_values.get("continue_from")
        return None if not source else _ids_of(source, "continue_from")

    def warm_start(self) -> Any:
        """The `loops.WarmStart` of `warm_start`: with continue_from, the other run's newest
        checkpoint whole (`loops.WarmStart.continuation`, its ids grown by this log's);
        with warm_start_from, the pattern's variables of it; each user and item table
        (embeddings, biases, a rating model's implicit factors) remapped from that run's
        ids.json to this log's ids, a dynamic table, keyed by raw id already, taken whole.
        None without either.

        Raises:
            ValueError: the other run has no ids.json, or it does not read.
        """
        import loops

        continued = self.warm_start_values.get("continue_from")
        source = continued or self.warm_start_values.get("warm_start_from")
        if not source:
            return None
        train = self.read().train
        row_ids = {}
        if not self.model["dynamic_ids"]:
            was = _ids_of(source, "continue_from" if continued else "warm_start_from")
            users, items = (was["users"], train.user_ids), (was["items"], train.item_ids)
            if self.model["model"] == "retrieval":
                row_ids = {"user_tower_table": users, "item_tower_table": items}
            else:
                row_ids = {
                    "user_table": users,
                    "user_bias": users,
                    "item_table": items,
                    "item_bias": items,
                }
                if self.model["user_history"]:
                    row_ids["implicit_factors"] = items
        if continued:
            return loops.WarmStart.continuation(source, row_ids=row_ids)
        return loops.WarmStart(
            source, variables=self.warm_start_values["warm_start_variables"], row_ids=row_ids
        )

    def _history(self, train: Interactions) -> Any:
        """The users x items table of each user's training items with user_history, else None
        (`loops_models.recommender.history_table`)."""
        from loops_models import recommender

        if not self.model["user_history"]:
            return None
        return recommender.history_table(train.users, train.items, train.num_users, train.num_items)

    def _retrieval(self, log: Any, placed, common) -> Any:
        import loops
        from loops_models import recommender

        model, train = self.model, log.train

        tables = self._tables(train)

        def tower(count: int, name: str) -> Callable[[], Any]:
            ids = tables.get("user_ids" if name == "user_tower" else "item_ids")
            return lambda: recommender.id_tower(
                num_ids=count,
                embedding_dim=model["embedding_dim"],
                features=self._history(train) if name == "user_tower" else None,
                normalize=model["normalize_towers"],
                seed=self.seed,
                name=name,
                table_optimizer_fn=placed,
                ids=ids,
                dynamic=tables.get("dynamic"),
            )

        return loops.RetrievalLoop(
            user_model_fn=tower(train.num_users, "user_tower"),
            item_model_fn=tower(train.num_items, "item_tower"),
            global_batch_size=self.global_batch_size,
            item_frequencies=train.item_counts(),
            temperature=model["temperature"],
            negatives=model["negatives"],
            l2=0.0 if model["normalize_towers"] else model["l2"],
            top_k=(model["top_k"],),
            **common,
        )

    def _rating(self, log: Any, placed, common) -> Any:
        import loops
        from loops_models import recommender

        model, train = self.model, log.train
        return loops.RatingLoop(
            model_fn=lambda: recommender.rating_model(
                num_users=train.num_users,
                num_items=train.num_items,
                embedding_dim=model["embedding_dim"],
                hidden_units=(model["hidden_units"],) if model["hidden_units"] else (),
                l2=model["l2"],
                user_history=self._history(train),
                initial_bias=log.mean_rating(),
                seed=self.seed,
                table_optimizer_fn=placed,
                **self._tables(train),
            ),
            **common,
        )

    def trainer(self, arguments: Mapping[str, Any], *, model_dir: str | None = None) -> Any:
        """The `loops.Trainer` of this training: the log read and checked (`read`), the
        optimizers made, then a `model_dir` whose checkpoints were trained on another model
        kind, log or split refused before the Trainer is built
        (`loops.model_dir.run_config.refuse_other_training_data`, against the newest
        checkpoint's record, else config.json); `arguments` (the Trainer's keywords, e.g.
        `loops.cli.flags.binary_arguments`') with the log's identity added to their record.

        Raises:
            ValueError: as `read`, the optimizers, or the refusal.
        """
        import loops
        from loops.model_dir import run_config
        from loops.run.checkpoint_keeper import recorded_settings

        log = self.read()
        optimizer_fn, tables = self.optimizers()
        identity = self.identity()
        run_config.refuse_other_training_data(
            model_dir, identity, checkpoint_record=recorded_settings
        )
        record = {**(arguments.get("record") or {}), run_config.RESUME_IDENTITY: identity}
        definition = self.definition(optimizer_fn, tables)
        data = log.trainer_data(
            self.model["model"], global_batch_size=self.global_batch_size, seed=self.seed
        )
        return loops.Trainer(
            definition,
            **data,
            **{**arguments, "record": record},
            warm_start=self.warm_start(),
        )
