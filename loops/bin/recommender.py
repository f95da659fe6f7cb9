"""Trains a recommender on an interaction log (retrieval or rating): `python -m
loops.bin.recommender`."""

from __future__ import annotations

import os

from absl import flags

from loops.bin import binary_flags, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops.model_dir import run_config
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.RECOMMENDER.define()
FLAGS = flags.FLAGS


def _interactions():
    """The log --data names (or the generated one), split as --split says: (all, train,
    validation, test), validation None with --validation_fraction=0."""
    from loops.input import interaction_logs
    from loops_data import interactions as generated

    data = loop_flags.setting_values(data_settings.INTERACTIONS)
    if data["data"] is None:
        interactions = generated.generated_log(seed=FLAGS.seed)
    else:
        interactions = interaction_logs.read_interactions(data["data"])
    train, test = interaction_logs.split(
        interactions, how=data["split"], test_fraction=data["test_fraction"], seed=FLAGS.seed
    )
    validation = None
    if data["validation_fraction"]:
        train, validation = interaction_logs.split_validation(
            train,
            how=data["split"],
            validation_fraction=data["validation_fraction"],
            seed=FLAGS.seed,
        )
    return interactions, train, validation, test


def _history(model, train):
    """The users x items table of each user's training items (`history_table`) with
    --user_history, else None."""
    from loops_models import recommender

    if not model["user_history"]:
        return None
    return recommender.history_table(train.users, train.items, train.num_users, train.num_items)


def _retrieval(model, train, test, optimizer_fn, tables, data_notes):
    """The RetrievalLoop of the flags; `tables`: (the Update's table optimizer, the placed
    tables' optimizer), `training_settings.table_optimizer_fns`."""
    import loops
    from loops_data import recommender_data
    from loops_models import recommender

    def tower(count, name):
        return lambda: recommender.id_tower(
            num_ids=count,
            embedding_dim=model["embedding_dim"],
            features=_history(model, train) if name == "user_tower" else None,
            normalize=model["normalize_towers"],
            seed=FLAGS.seed,
            name=name,
            table_optimizer_fn=tables[1],
        )

    return loops.RetrievalLoop(
        user_model_fn=tower(train.num_users, "user_tower"),
        item_model_fn=tower(train.num_items, "item_tower"),
        optimizer_fn=optimizer_fn,
        table_optimizer_fn=tables[0],
        num_items=train.num_items,
        global_batch_size=FLAGS.global_batch_size,
        item_frequencies=train.item_counts(),
        temperature=model["temperature"],
        negatives=model["negatives"],
        l2=0.0 if model["normalize_towers"] else model["l2"],
        top_k=(model["top_k"],),
        baselines=recommender_data.popularity_baseline(train, test, model["top_k"]),
        data_notes=data_notes,
        **loop_flags.clip_norm_argument(),
    )


def _rating(model, train, test, optimizer_fn, tables, data_notes):
    """The RatingLoop of the flags; `tables` as `_retrieval`'s."""
    import loops
    from loops_data import recommender_data
    from loops_models import recommender

    return loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=train.num_users,
            num_items=train.num_items,
            embedding_dim=model["embedding_dim"],
            hidden_units=(model["hidden_units"],) if model["hidden_units"] else (),
            l2=model["l2"],
            user_history=_history(model, train),
            initial_bias=float(train.ratings.mean()),
            seed=FLAGS.seed,
            table_optimizer_fn=tables[1],
        ),
        optimizer_fn=optimizer_fn,
        table_optimizer_fn=tables[0],
        num_items=train.num_items,
        baselines=recommender_data.bias_baseline(train, test),
        data_notes=data_notes,
        **loop_flags.clip_norm_argument(),
    )


def _check_top_k(top_k: int, train) -> None:
    """Refuses a --top_k the export cannot return (both models), before any training."""
    if top_k > train.num_items:
        raise ValueError(
            f"--top_k={top_k} is more than the {train.num_items} items of the log "
            f"({train.source}), and the export returns a user's top K of them; pass "
            f"--top_k={train.num_items} or less."
        )


def _ids_json(train) -> str:
    from loops.model_dir import id_vocabulary

    return id_vocabulary.ids_json(train.user_ids, train.item_ids)


def _prepare() -> None:
    """A relative --data as the absolute path it names from here: config.json records the
    file the run reads, and an evaluator started elsewhere takes that file, not its own.
    With a validation split and no --keep_best_metric, the model's own metric is kept best:
    rmse (min) for rating, recall_at_K (max) for retrieval. --placed_tables without a table
    optimizer of their own is refused."""
    training_settings.check_placed_tables(
        loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    )
    if FLAGS.data is not None:
        loop_flags.set_values({"data": os.path.abspath(FLAGS.data)})
    if FLAGS.validation_fraction and FLAGS.keep_best_metric is None:
        if FLAGS.model == "retrieval":
            best = {"keep_best_metric": f"recall_at_{FLAGS.top_k}", "keep_best_mode": "max"}
        else:
            best = {"keep_best_metric": "rmse", "keep_best_mode": "min"}
        loop_flags.set_values(best)


def _resume_identity(model_kind, interactions, train, validation, test):
    """The model kind, log and split this run trains on (`loops.input.log_identity`)."""
    from loops.input import log_identity

    data = loop_flags.setting_values(data_settings.INTERACTIONS)
    return log_identity.identity(
        model_kind,
        interactions,
        train,
        test,
        path=data["data"],
        how=data["split"],
        test_fraction=data["test_fraction"],
        seed=FLAGS.seed,
        validation=validation,
        validation_fraction=data["validation_fraction"],
    )


def _refuse_other_training_data(identity) -> None:
    """Refuses, before the Trainer is built, to go on from (or evaluate) checkpoints in
    --model_dir trained on another model kind, log or split: ValueError naming what changed
    (`run_config.check_resume`, against the newest checkpoint's record, else config.json)."""
    model_dir = FLAGS.model_dir
    if not model_dir:
        return
    from loops.model_dir.checkpoints import newest_complete
    from loops.run.checkpoint_keeper import recorded_settings

    if newest_complete(os.path.join(model_dir, "checkpoints")) is None:
        return  # nothing to go on from
    run_config.check_resume(
        model_dir,
        {run_config.RESUME_IDENTITY: identity},
        checkpoint_record=recorded_settings(model_dir),
    )


def _own_actions(model, train, validation, test) -> list:
    """ids.json as training starts; with a validation split and a kept best checkpoint, the
    best model restored and tested once on the test rows when training ends (before the
    export, which `binary_arguments` adds after these)."""
    from loops.model_dir import id_vocabulary
    from loops.run.actions import WriteRunFile
    from loops.run.best_checkpoint import RestoreBestOnEnd
    from loops_data import recommender_data

    actions: list = [WriteRunFile(id_vocabulary.ID_FILE, lambda: _ids_json(train()))]
    if FLAGS.validation_fraction and FLAGS.keep_best_metric:

        def test_figures(definition):
            return recommender_data.test_figures(
                model["model"],
                definition,
                train(),
                recommender_data.joined(train(), validation()),
                test(),
                top_k=model["top_k"],
            )

        actions.append(RestoreBestOnEnd(test_figures))
    return actions


def build_trainer():
    """The RetrievalLoop or RatingLoop the flags describe; ValueError for a bad combination."""
    import loops
    from loops.model_dir.export import export_recommender
    from loops_data import recommender_data

    model = loop_flags.setting_values(model_settings.RECOMMENDER)
    parts: dict = {}
    # The export, ids.json and the final test serve the log's own ids; they read the split
    # (below) once training starts or ends.
    arguments = loop_flags.binary_arguments(
        "recommender",
        export=lambda definition, path: export_recommender(
            definition.model,
            path,
            score_all_items=definition.score_all_items,
            score_pairs=definition.score_pairs,
            top_k=model["top_k"],
            user_ids=parts["train"].user_ids,
            item_ids=parts["train"].item_ids,
            item_counts=parts["train"].item_counts(),
        ),
        signature="the log's user ids -> items, scores, known_user (top K); "
        "score_pairs: users, items -> scores, known_user, known_item",
        actions=_own_actions(
            model, *(lambda name=name: parts[name] for name in ("train", "validation", "test"))
        ),
    )
    interactions, train, validation, test = _interactions()
    parts.update(train=train, validation=validation, test=test)
    _check_top_k(model["top_k"], train)
    optimizer = loop_flags.setting_values(training_settings.OPTIMIZER)
    model_settings.check_recommender_fits(
        model,
        num_users=train.num_users,
        num_items=train.num_items,
        copies=training_settings.weight_copies(optimizer),
    )
    optimizer_fn = training_settings.optimizer_fn(
        optimizer, learning_rate=FLAGS.learning_rate, total_steps=FLAGS.train_steps
    )
    data_notes = recommender_data.notes(interactions, train, test, validation)
    identity = _resume_identity(model["model"], interactions, train, validation, test)
    _refuse_other_training_data(identity)
    arguments["record"] = {**arguments["record"], run_config.RESUME_IDENTITY: identity}
    evaluated = test if validation is None else validation
    build = _retrieval if model["model"] == "retrieval" else _rating
    tables = training_settings.table_optimizer_fns(
        loop_flags.setting_values(training_settings.TABLE_OPTIMIZER),
        learning_rate=FLAGS.learning_rate,
    )
    definition = build(model, train, evaluated, optimizer_fn, tables, data_notes)
    data = recommender_data.trainer_data(
        model["model"], train, evaluated, global_batch_size=FLAGS.global_batch_size, seed=FLAGS.seed
    )
    return loops.Trainer(definition, **data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__, prepare=_prepare)

if __name__ == "__main__":
    run()
