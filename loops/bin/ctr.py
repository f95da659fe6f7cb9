"""Trains a click-through model (wide & deep, DCN-v2 or DLRM) on a feature table: `python -m
loops.bin.ctr`."""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from loops.bin import binary_flags, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops.model_dir import run_config
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.CTR.define()
FLAGS = flags.FLAGS

# The spec and table `_prepare` checked before TensorFlow started, which training reads.
_checked: dict[str, Any] = {}


def _prepare() -> None:
    """Refuses a missing file, a spec that does not fit the table, or dlrm without a numeric
    column, before TensorFlow starts; --data and --spec as the absolute paths they name
    (config.json records the files the run reads). With a validation split and no
    --keep_best_metric, the checkpoint of the best validation auc is kept."""
    from loops_data import ctr_tables

    if (FLAGS.data is None) != (FLAGS.spec is None):
        given, missing = ("data", "spec") if FLAGS.spec is None else ("spec", "data")
        raise ValueError(
            f"--{given}={FLAGS[given].value} is given without --{missing}: a feature table is "
            f"read by its spec, so pass both (docs/ctr.md), or neither to train on the "
            "generated click log."
        )
    fitted = None
    if FLAGS.data is not None:
        paths = {"data": os.path.abspath(FLAGS.data), "spec": os.path.abspath(FLAGS.spec)}
        loop_flags.set_values(paths)
        spec, table, fitted = ctr_tables.checked_fit(paths["data"], paths["spec"])
        if FLAGS.model == "dlrm" and not any(c.kind == "numeric" for c in spec.columns):
            raise ValueError(
                f"--model=dlrm's bottom MLP reads the numeric columns and --spec={FLAGS.spec} "
                "has none; add a numeric column to the spec or pass --model=dcn_v2."
            )
        _check_served_names(spec)
        _checked.update(spec=spec, table=table)
    else:
        ctr_tables.check_generated_rows_fit(FLAGS.generated_rows)
    _check_model_fits(fitted)
    training_settings.check_placed_tables(
        loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    )
    _checked["identity"] = _identity()
    _refuse_other_data(_checked["identity"], against_checkpoint=False)
    if FLAGS.validation_fraction and FLAGS.keep_best_metric is None:
        loop_flags.set_values({"keep_best_metric": "auc", "keep_best_mode": "max"})


def _check_served_names(spec) -> None:
    """Refuses a spec two of whose columns the export would serve under one name, before
    training (`loops.model_dir.signature_names`)."""
    from loops.model_dir import signature_names

    try:
        signature_names.check_spec(spec)
    except ValueError as error:
        raise ValueError(f"{error} (--spec={FLAGS.spec})") from None


def _check_model_fits(fitted) -> None:
    """Refuses a model whose weights over the tables of --spec (`fitted`: its whole table's
    vocabularies) or of the generated log (None) cannot fit in this machine's memory
    (`loops_models.settings.check_ctr_fits`)."""
    from loops_data import ctr_tables

    numeric, hashed = ctr_tables.GENERATED_SHAPE["numeric_columns"], []
    if fitted is None:
        tables, source = ctr_tables.generated_tables(), "the generated log"
    else:
        columns = fitted.spec.columns
        numeric = sum(column.kind == "numeric" for column in columns)
        hashed = [c.name for c in columns if c.kind != "numeric" and c.option("hash_buckets")]
        tables, source = fitted.cardinalities(), f"--spec={FLAGS.spec}"
    optimizer = loop_flags.setting_values(training_settings.OPTIMIZER)
    table_optimizer = loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    model_settings.check_ctr_fits(
        loop_flags.setting_values(model_settings.CTR),
        numeric_columns=numeric,
        tables=tables,
        copies=(
            training_settings.table_weight_copies(optimizer, table_optimizer),
            training_settings.weight_copies(optimizer),
        ),
        source=source,
        hashed=hashed,
    )


def _identity() -> dict[str, Any]:
    """The model, the table and spec files (or the generator's settings) and the split this
    run trains on (`loops.input.log_identity.table_identity`)."""
    from loops.input import log_identity

    data = loop_flags.setting_values(data_settings.CTR_DATA)
    generated = data["data"] is None
    return log_identity.table_identity(
        FLAGS.model,
        files={} if generated else {"data": data["data"], "spec": data["spec"]},
        generated={"generated_rows": data["generated_rows"]} if generated else {},
        test_fraction=data["test_fraction"],
        validation_fraction=data["validation_fraction"],
        seed=FLAGS.seed,
    )


def _refuse_other_data(identity: dict[str, Any], *, against_checkpoint: bool) -> None:
    """Refuses to go on from (or evaluate) checkpoints in --model_dir trained on another model,
    table, spec, generated log or split: ValueError naming each change and the fix. Before
    TensorFlow starts, against config.json; before the Trainer is built, against the newest
    checkpoint's own record (a config.json gone or damaged says nothing)."""
    checkpoints = os.path.join(FLAGS.model_dir or "", "checkpoints")
    if not FLAGS.model_dir or not os.path.isdir(checkpoints):
        return
    if not any(name.endswith(".index") for name in os.listdir(checkpoints)):
        return  # nothing to go on from
    record = None
    if against_checkpoint:
        from loops.run.checkpoint_keeper import recorded_settings

        record = recorded_settings(FLAGS.model_dir)
    run_config.check_resume(
        FLAGS.model_dir, {run_config.RESUME_IDENTITY: identity}, checkpoint_record=record
    )


def _split_table():
    """The rows the flags name, split (`loops_data.ctr_tables.SplitTable`)."""
    from loops_data import ctr_tables

    data = loop_flags.setting_values(data_settings.CTR_DATA)
    split = dict(
        seed=FLAGS.seed,
        test_fraction=data["test_fraction"],
        validation_fraction=data["validation_fraction"],
    )
    if data["data"] is None:
        return ctr_tables.generated(data["generated_rows"], **split)
    if not _checked:  # main() checked it; a caller of build_trainer alone has not
        _checked.update(
            zip(("spec", "table"), ctr_tables.checked_table(data["data"], data["spec"]))
        )
    return ctr_tables.from_table(_checked["spec"], _checked["table"], **split)


def _model_fn(features: dict[str, Any], placed_table_optimizer_fn):
    """() -> the Keras model the model flags describe over `features` (columns by kind), its
    tables `loops.EmbeddingTable`s of `placed_table_optimizer_fn` when it is given."""
    from loops_models import ctr

    described = ctr.CTRFeatures(**features)
    model = loop_flags.setting_values(model_settings.CTR)
    name = model.pop("model")
    return lambda: ctr.build_model(
        name,
        described,
        **model,
        seed=FLAGS.seed,
        table_optimizer_fn=placed_table_optimizer_fn,
    )


def _own_actions(table) -> list:
    """With a validation split and a kept best checkpoint: the best model restored and tested
    once on the test rows when training ends (before the export, added after these)."""
    from loops.run.best_checkpoint import RestoreBestOnEnd
    from loops_data import ctr_tables

    if not (FLAGS.validation_fraction and FLAGS.keep_best_metric):
        return []
    return [RestoreBestOnEnd(lambda definition: ctr_tables.model_figures(definition, table().test))]


def _export(definition, path: str, table) -> str:
    from loops.model_dir.export import export_ctr

    fitted = table.fitted
    files = None if fitted is None else {"features.json": fitted.to_json()}
    # A generated log's tables: its description's cardinalities (a table's are in `fitted`).
    tables = None if fitted else {**table.features["categorical"], **table.features["multi_hot"]}
    return export_ctr(definition.model, path, files=files, fitted=fitted, cardinalities=tables)


def build_trainer():
    """The CTRLoop the flags describe; ValueError for a bad combination."""
    import loops
    from loops_data import ctr_tables

    parts: dict[str, Any] = {}
    # The export and the final test read the split (below) once training starts or ends.
    arguments = loop_flags.binary_arguments(
        "ctr",
        export=lambda definition, path: _export(definition, path, parts["table"]),
        signature="a table's raw columns (a generated log's prepared columns) by name -> "
        "logits, probabilities, valid_row",
        actions=_own_actions(lambda: parts["table"]),
    )
    identity = _checked.get("identity") or _identity()
    _refuse_other_data(identity, against_checkpoint=True)
    arguments["record"] = {**arguments["record"], run_config.RESUME_IDENTITY: identity}
    table = parts["table"] = _split_table()
    evaluated = table.test if table.validation is None else table.validation
    tables, placed = training_settings.table_optimizer_fns(
        loop_flags.setting_values(training_settings.TABLE_OPTIMIZER),
        learning_rate=FLAGS.learning_rate,
    )
    definition = loops.CTRLoop(
        model_fn=_model_fn(table.features, placed),
        optimizer_fn=training_settings.optimizer_fn(
            loop_flags.setting_values(training_settings.OPTIMIZER),
            learning_rate=FLAGS.learning_rate,
            total_steps=FLAGS.train_steps,
        ),
        table_optimizer_fn=tables,
        auc_examples=max(len(evaluated), 1),
        eval_batch_size=FLAGS.global_batch_size,
        data_notes=table.notes(),
        **loop_flags.clip_norm_argument(),
    )
    data = ctr_tables.trainer_data(
        table.train, evaluated, global_batch_size=FLAGS.global_batch_size, seed=FLAGS.seed
    )
    return loops.Trainer(definition, **data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__, prepare=_prepare)

if __name__ == "__main__":
    run()
