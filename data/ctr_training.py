"""A click-through model's training as `loops-ctr` sets it up, from plain values, so a Python
user reaches each part of it (`CTRTraining`): the checks of a feature table, its spec and the
model's size before TensorFlow starts, the refusal of a model_dir trained on other data, the
split rows, the CTRLoop over `loops_models.ctr`, and its kept best model's test and export.

Nothing here imports TensorFlow when loaded: the binary checks a table before TensorFlow starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from loops_models import settings as model_settings

if TYPE_CHECKING:
    from loops.input.feature_tables import FeatureSpec, FittedFeatures
    from loops_data.ctr_streams import StreamedTable
    from loops_data.ctr_tables import SplitTable

# What the export's default signature takes and gives (`loops.cli.flags.binary_arguments`').
SIGNATURE = (
    "a table's raw columns (a generated log's prepared columns) by name -> "
    "logits, probabilities, valid_row"
)
# The checkpoint kept best with a validation split and no metric named.
KEEP_BEST = {"keep_best_metric": "auc", "keep_best_mode": "max"}

# () -> (a loop's optimizer_fn, (its keras tables' table_optimizer_fn, its placed tables'
# optimizer_fn)), either of the two None: `loops.bin.training_settings.optimizer_fn` and
# `table_optimizer_fns`.
Optimizers = Callable[[], tuple[Callable[[], Any], tuple[Any, Any]]]


class CTRTraining:
    """A CTRLoop's training on a feature table or a generated click log, as loops-ctr sets it
    up. The rows are split once, when first needed (`split`): the export and the test of the
    kept best model (`outputs`), made before it for a Trainer's arguments, read them when
    training ends.

    Args:
        data: `loops_data.settings.CTR_DATA`'s values (data and spec: a feature table's file
            and its JSON spec, both or neither, relative ones taken from here; neither: the
            generated click log of generated_rows; test_fraction; validation_fraction).
        model: `loops_models.settings.CTR`'s values (model: wide_deep, dcn_v2 or dlrm;
            embedding_dim, hidden_units, ...).
        seed: the generated log's, the split's, the weights' and the batches' seed.
        global_batch_size: the rows of a training batch and of an eval batch.
        optimizers: () -> the loop's optimizers (`Optimizers`), called once the rows are split.
        weight_copies: the copies of every embedding-table weight and of every other weight
            that training holds (the weights and their optimizer's slots), for the check of
            the model's size against memory.
        clip_norm: the loop's gradient clipping; None for its default.
        warm_start: `loops.bin.training_settings.WARM_START`'s values (continue_from: the
            model_dir of a run of this model to go on from on new rows, its statistics grown
            by them (`loops.input.feature_growth`); warm_start_from: another run's model_dir,
            warm_start_variables its variables to take; each None or absent for neither).
        checked: where `check` keeps what it read (the spec and the table of a file, and the
            identity), for a CTRTraining of the same run built later (once TensorFlow has
            started) to read again; None: its own.
        pass_worker: this task's (index, count) among the workers of a cluster, which split
            the statistics pass of a log of shards through the model_dir
            (`loops.input.fit_exchange`); None: this process reads every block.

    Raises:
        ValueError: data without spec, or spec without data.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        model: Mapping[str, Any],
        *,
        seed: int,
        global_batch_size: int,
        optimizers: Optimizers,
        weight_copies: tuple[int, int] = (1, 1),
        clip_norm: float | None = None,
        warm_start: Mapping[str, Any] | None = None,
        checked: dict[str, Any] | None = None,
        pass_worker: tuple[int, int] | None = None,
    ):
        self.data, self.model = dict(data), dict(model)
        self.pass_worker = pass_worker
        if (self.data["data"] is None) != (self.data["spec"] is None):
            given, missing = ("data", "spec") if self.data["spec"] is None else ("spec", "data")
            raise ValueError(
                f"--{given}={self.data[given]} is given without --{missing}: a feature table is "
                f"read by its spec, so pass both (docs/ctr.md), or neither to train on the "
                "generated click log."
            )
        for name in self.files:
            self.data[name] = os.path.abspath(self.data[name])
        self.seed, self.global_batch_size = seed, global_batch_size
        self.optimizers, self.weight_copies = optimizers, weight_copies
        self.loop_options = {} if clip_norm is None else {"clip_norm": clip_norm}
        self.checked = {} if checked is None else checked
        self.warm_start_values = dict(warm_start or {})
        self._table: SplitTable | StreamedTable | None = None

    @property
    def streamed(self) -> bool:
        """Whether --data names a log of shards, streamed (`loops_data.ctr_streams`)."""
        from loops_data.ctr_streams import names_shards

        return names_shards(self.data["data"], self.data.get("format"))

    @property
    def files(self) -> dict[str, str]:
        """{"data": the table's path, "spec": its spec's}; {} for the generated log."""
        if self.data["data"] is None:
            return {}
        return {"data": self.data["data"], "spec": self.data["spec"]}

    def filled_in(self, keep_best_metric: str | None) -> dict[str, Any]:
        """The settings loops-ctr fills in before training: data and spec as the absolute
        paths they name (config.json records the files the run reads); with a validation
        split and no `keep_best_metric`, the checkpoint of the best validation auc kept."""
        filled: dict[str, Any] = dict(self.files)
        if self.data["validation_fraction"] and keep_best_metric is None:
            filled.update(KEEP_BEST)
        return filled

    def check(self, model_dir: str | None = None) -> None:
        """Refuses, before TensorFlow starts: a missing file, a spec that does not fit the
        table, dlrm without a numeric column, a spec two of whose columns the export would
        serve under one name, a generated log or a model whose weights cannot fit in this
        machine's memory; then a `model_dir` whose checkpoints were trained on another
        model, table, spec, generated log or split (against its config.json,
        `loops.model_dir.run_config.refuse_other_training_data`). Keeps the spec and table
        read, and the identity, in `checked`.

        Raises:
            ValueError: naming the value and the fix.
        """
        from loops.input import feature_growth
        from loops.model_dir import run_config
        from loops_data import ctr_tables

        fitted = None
        if self.streamed:
            # A changed log is refused before its pass; a resume reads the run's statistics.
            self.checked["model_dir"] = model_dir
            run_config.refuse_other_training_data(model_dir, self._identity())
            spec, _, fitted = self._checked_log()
        elif self.data["data"] is not None:
            spec, table, fitted = ctr_tables.checked_fit(self.data["data"], self.data["spec"])
            self.checked.update(table=table, spec=spec)
            grown_from = self.grown_from()
            if grown_from is not None:  # the model's tables: the whole table's values grown
                fitted = feature_growth.grown(grown_from, fitted)
        else:
            self.grown_from()  # a generated log's continuation: from one of the generated log
        if fitted is not None:
            if self.model["model"] == "dlrm" and not any(c.kind == "numeric" for c in spec.columns):
                raise ValueError(
                    f"--model=dlrm's bottom MLP reads the numeric columns and "
                    f"--spec={self.data['spec']} has none; add a numeric column to the spec or "
                    "pass --model=dcn_v2."
                )
            self._check_served_names(spec)
            self.checked.update(spec=spec)
        else:
            ctr_tables.check_generated_rows_fit(self.data["generated_rows"])
        self._check_model_fits(fitted)
        identity = self.checked["identity"] = self._identity()
        run_config.refuse_other_training_data(model_dir, identity)

    def _opened_log(self) -> tuple[FeatureSpec, Any]:
        """The spec and the indexed log of shards, opened once (`ctr_streams.opened_log`)."""
        if "log" not in self.checked:
            from loops_data import ctr_streams

            read = ctr_streams.opened_log(
                self.data["data"], self.data["spec"], file_format=self.data.get("format")
            )
            self.checked.update(zip(("spec", "log"), read))
        return self.checked["spec"], self.checked["log"]

    def _checked_log(self) -> tuple[FeatureSpec, Any, FittedFeatures]:
        """The spec, the indexed log and its training rows' statistics: those a run in the
        model_dir fitted, else one streaming pass (`ctr_streams.fitted_log`), once."""
        spec, log = self._opened_log()
        if "fitted" not in self.checked:
            from loops_data import ctr_streams

            self.checked["fitted"] = ctr_streams.fitted_log(
                spec,
                log,
                split=self._split_fractions(),
                model_dir=self.checked.get("model_dir"),
                flags=f"--data={self.data['data']}, --spec={self.data['spec']}",
                grown_from=self.grown_from(),
                worker=self.pass_worker,
            )
        return spec, log, self.checked["fitted"]

    def grown_from(self) -> FittedFeatures | None:
        """With --continue_from, the statistics of the run it names, which this run's grow by
        its training rows' (`loops.input.feature_growth.grown`), checked once to hold this
        run's spec; None without it (or from the generated log onto it).

        Raises:
            ValueError: that run's statistics missing or of another spec or kind of data
                (`loops_data.ctr_starts.continued_features`), naming both and the fix.
        """
        if "grown_from" not in self.checked:
            from loops.input import feature_growth
            from loops_data import ctr_starts

            grown_from = ctr_starts.continued_features(
                self.warm_start_values, self.data["data"] is not None
            )
            if grown_from is not None:
                spec = self._opened_log()[0] if self.streamed else self._spec()
                source = self.warm_start_values["continue_from"]
                try:
                    feature_growth.check_same_spec(grown_from, spec, repr(source))
                except ValueError as error:
                    raise ValueError(f"{error} (--spec={self.data['spec']})") from None
            self.checked["grown_from"] = grown_from
        return self.checked["grown_from"]

    def _spec(self) -> FeatureSpec:
        """A feature table's spec, as `check` read it, else read now."""
        if "spec" not in self.checked:
            from loops.input.feature_tables import FeatureSpec

            self.checked["spec"] = FeatureSpec.read(self.data["spec"])
        return self.checked["spec"]

    def _split_fractions(self) -> tuple[float, float]:
        return self.data["test_fraction"], self.data["validation_fraction"]

    def _check_served_names(self, spec: FeatureSpec) -> None:
        """Refuses a spec two of whose columns the export would serve under one name, before
        training (`loops.model_dir.signature_names`)."""
        from loops.model_dir import signature_names

        try:
            signature_names.check_spec(spec)
        except ValueError as error:
            raise ValueError(f"{error} (--spec={self.data['spec']})") from None

    def _check_model_fits(self, fitted: FittedFeatures | None) -> None:
        """Refuses a model whose weights over the tables of the spec (`fitted`: its whole
        table's vocabularies) or of the generated log (None) cannot fit in this machine's
        memory (`loops_models.settings.check_ctr_fits`)."""
        from loops_data import ctr_tables

        numeric, hashed = ctr_tables.GENERATED_SHAPE["numeric_columns"], []
        if fitted is None:
            tables, source = ctr_tables.generated_tables(), "the generated log"
        else:
            columns = fitted.spec.columns
            numeric = sum(column.kind == "numeric" for column in columns)
            hashed = [c.name for c in columns if c.kind != "numeric" and c.option("hash_buckets")]
            tables, source = fitted.cardinalities(), f"--spec={self.data['spec']}"
        model_settings.check_ctr_fits(
            self.model,
            numeric_columns=numeric,
            tables=tables,
            copies=self.weight_copies,
            source=source,
            hashed=hashed,
        )

    def _identity(self) -> dict[str, Any]:
        """The model, the table and spec files (or the generator's settings) and the split this
        training reads (`loops.input.log_identity.table_identity`)."""
        from loops.input import log_identity

        generated = self.data["data"] is None
        files = dict(self.files)
        if self.streamed:
            del files["data"]  # a log of shards is recorded by its shards' identities
        identity = log_identity.table_identity(
            self.model["model"],
            files=files,
            generated={"generated_rows": self.data["generated_rows"]} if generated else {},
            test_fraction=self.data["test_fraction"],
            validation_fraction=self.data["validation_fraction"],
            seed=self.seed,
        )
        if self.streamed:
            from loops_data.ctr_streams import log_record

            identity["files"]["data"] = log_record(self._opened_log()[1])
            identity["split"]["how"] = "row hash"
            identity["split"]["shuffle_window"] = self.data.get("shuffle_window", 8)
        return identity

    def identity(self) -> dict[str, Any]:
        """What a run in a model_dir must share to go on from its checkpoints: the one `check`
        kept, else this training's (`loops.input.log_identity.table_identity`)."""
        return self.checked.get("identity") or self._identity()

    def split(self) -> SplitTable:
        """The rows the data names, split (`loops_data.ctr_tables.SplitTable`), once; a
        table's spec and rows as `check` read them, else read and checked now."""
        if self._table is None:
            from loops_data import ctr_tables

            split = dict(
                seed=self.seed,
                test_fraction=self.data["test_fraction"],
                validation_fraction=self.data["validation_fraction"],
            )
            if self.data["data"] is None:
                self._table = ctr_tables.generated(self.data["generated_rows"], **split)
            elif self.streamed:
                from loops_data.ctr_streams import StreamedTable

                _, log, fitted = self._checked_log()
                self._table = StreamedTable(
                    log,
                    fitted,
                    self.data["test_fraction"],
                    self.data["validation_fraction"],
                    self.data.get("shuffle_window", 8),
                )
            else:
                if "spec" not in self.checked:
                    read = ctr_tables.checked_table(self.data["data"], self.data["spec"])
                    self.checked.update(zip(("spec", "table"), read))
                spec, table = self.checked["spec"], self.checked["table"]
                grown_from = self.grown_from()
                self._table = ctr_tables.from_table(spec, table, **split, grown_from=grown_from)
        return self._table

    def outputs(self, keep_best_metric: str | None) -> dict[str, Any]:
        """What this training adds to a Trainer (`loops.cli.flags.binary_arguments`'
        keywords): its export (`export`, serving `SIGNATURE`) and, with a validation split
        and a `keep_best_metric`, the best model restored and tested once on the test rows
        when training ends (`test_figures`, before the export, which comes after it)."""
        actions: list = []
        if self.data["validation_fraction"] and keep_best_metric:
            from loops.run.best_checkpoint import RestoreBestOnEnd

            actions.append(RestoreBestOnEnd(self.test_figures))
        return {"export": self.export, "signature": SIGNATURE, "actions": actions}

    def test_figures(self, definition: Any) -> dict[str, Any]:
        """The trained `definition`'s figures on the test rows
        (`loops_data.ctr_tables.model_figures`)."""
        from loops_data import ctr_tables

        table = self.split()
        if not isinstance(table, ctr_tables.SplitTable):
            return table.test_figures(definition, self.global_batch_size)
        return ctr_tables.model_figures(definition, table.test)

    def export(self, definition: Any, export_dir: str) -> str:
        """Exports the trained `definition`'s model to `export_dir`: a table's serving its raw
        columns, features.json beside it; a generated log's its prepared columns
        (`loops.model_dir.ctr_export.export_ctr`). Returns export_dir."""
        from loops.model_dir.ctr_export import export_ctr

        table = self.split()
        fitted = table.fitted
        files = None if fitted is None else {"features.json": fitted.to_json()}
        # A generated log's tables: its description's cardinalities (a table's are in `fitted`).
        tables = (
            None if fitted else {**table.features["categorical"], **table.features["multi_hot"]}
        )
        from loops_models import ctr

        known = ctr.dynamic_tables_of(definition.model, ctr.CTRFeatures(**table.features))
        return export_ctr(
            definition.model,
            export_dir,
            files=files,
            fitted=fitted,
            cardinalities=tables,
            known_ids=known,
        )

    def definition(self, optimizer_fn: Callable[[], Any], tables: tuple[Any, Any]) -> Any:
        """The CTRLoop of the model settings over the split's columns, evaluated on its
        validation rows (its test rows without); `tables`: (its keras tables'
        table_optimizer_fn, its placed tables' optimizer_fn)."""
        import loops
        from loops_data import ctr_tables
        from loops_models import ctr

        table = self.split()
        if isinstance(table, ctr_tables.SplitTable):
            evaluated = len(table.test if table.validation is None else table.validation)
        else:
            evaluated = table.counts[table.evaluated]
        described = ctr.CTRFeatures(**table.features)
        model = dict(self.model)
        name = model.pop("model")
        notes = table.notes()
        grown_from = self.grown_from()
        if grown_from is not None and table.fitted is not None:
            from loops.input import feature_growth

            notes["features"] = {
                "grown_from": self.warm_start_values["continue_from"],
                "rule": feature_growth.RULE,
                "vocabularies": feature_growth.growth(grown_from, table.fitted),
            }
        return loops.CTRLoop(
            model_fn=lambda: ctr.build_model(
                name, described, **model, seed=self.seed, table_optimizer_fn=tables[1]
            ),
            optimizer_fn=optimizer_fn,
            table_optimizer_fn=tables[0],
            auc_examples=max(evaluated, 1),
            eval_batch_size=self.global_batch_size,
            data_notes=notes,
            **self.loop_options,
        )

    def trainer(self, arguments: Mapping[str, Any], *, model_dir: str | None = None) -> Any:
        """The `loops.Trainer` of this training: first a `model_dir` whose checkpoints were
        trained on another model, table, spec, generated log or split refused, before the
        Trainer is built (`loops.model_dir.run_config.refuse_other_training_data`, against
        the newest checkpoint's record, else config.json); then the rows split, the
        optimizers made and the definition built; `arguments` (the Trainer's keywords, e.g.
        `loops.cli.flags.binary_arguments`') with the identity added to their record, a
        --continue_from or --warm_start_from applied (`warm_start`), and a table's or log's
        statistics written into the model_dir as training starts
        (`loops_data.ctr_starts.FEATURES_FILE`, which a continuation of this run grows).

        Raises:
            ValueError: the refusal, as `split`, or the optimizers.
        """
        import loops
        from loops.model_dir import run_config
        from loops.run.checkpoint_keeper import recorded_settings
        from loops_data import ctr_tables

        identity = self.identity()
        run_config.refuse_other_training_data(
            model_dir, identity, checkpoint_record=recorded_settings
        )
        record = {**(arguments.get("record") or {}), run_config.RESUME_IDENTITY: identity}
        self.checked.setdefault("model_dir", model_dir)
        table = self.split()
        definition = self.definition(*self.optimizers())
        if isinstance(table, ctr_tables.SplitTable):
            data = ctr_tables.trainer_data(
                table.train,
                table.test if table.validation is None else table.validation,
                global_batch_size=self.global_batch_size,
                seed=self.seed,
            )
        else:
            data = table.trainer_data(global_batch_size=self.global_batch_size, seed=self.seed)
        actions = list(arguments.get("actions", ()))
        if table.fitted is not None:
            from loops.run.actions import WriteRunFile
            from loops_data.ctr_starts import FEATURES_FILE

            # The statistics the checkpoints are trained on: what a continuation grows.
            actions.append(WriteRunFile(FEATURES_FILE, table.fitted.to_json))
        trainer = loops.Trainer(
            definition,
            **data,
            **{**arguments, "record": record, "actions": actions},
            warm_start=self.warm_start(),
        )
        # The chief's, in the model_dir its Trainer made: another worker's would race it.
        if self.streamed and model_dir and trainer.run_context.is_chief:
            from loops_data import ctr_streams

            spec, log, fitted = self._checked_log()
            ctr_streams.save_fit(
                model_dir, spec, log, fitted, self._split_fractions(), self.grown_from()
            )
        return trainer

    def warm_start(self) -> Any:
        """The `loops.WarmStart` of --continue_from or --warm_start_from, each vocabulary
        column's tables remapped by value from that run's statistics to this run's
        (`loops_data.ctr_starts.warm_start`); None without either.

        Raises:
            ValueError: as `loops_data.ctr_starts.source_features`.
        """
        from loops_data import ctr_starts
        from loops_models import ctr

        if ctr_starts.source_of(self.warm_start_values) is None:
            return None
        table = self.split()
        layers = ctr.table_layers(self.model["model"], ctr.CTRFeatures(**table.features))
        return ctr_starts.warm_start(self.warm_start_values, table.fitted, layers)
