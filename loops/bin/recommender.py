"""Trains a recommender on an interaction log (retrieval or rating): `python -m
loops.bin.recommender`."""

from __future__ import annotations

from absl import flags

from loops.bin import binary_flags, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.RECOMMENDER.define()
FLAGS = flags.FLAGS


def _interactions():
    """The log --data names (or the generated one), split as --split says: (all, train, test)."""
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
    return interactions, train, test


def _retrieval(model, train, test, optimizer_fn, data_notes):
    import loops
    from loops_data import recommender_data
    from loops_models import recommender

    model_settings.check_top_k_fits(model["top_k"], train.num_items)

    def tower(count, name):
        return lambda: recommender.id_tower(
            num_ids=count, embedding_dim=model["embedding_dim"], seed=FLAGS.seed, name=name
        )

    return loops.RetrievalLoop(
        user_model_fn=tower(train.num_users, "user_tower"),
        item_model_fn=tower(train.num_items, "item_tower"),
        optimizer_fn=optimizer_fn,
        num_items=train.num_items,
        global_batch_size=FLAGS.global_batch_size,
        item_frequencies=train.item_counts(),
        temperature=model["temperature"],
        top_k=(model["top_k"],),
        baselines=recommender_data.popularity_baseline(train, test, model["top_k"]),
        data_notes=data_notes,
        **loop_flags.clip_norm_argument(),
    )


def _rating(model, train, test, optimizer_fn, data_notes):
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
            initial_bias=float(train.ratings.mean()),
            seed=FLAGS.seed,
        ),
        optimizer_fn=optimizer_fn,
        num_items=train.num_items,
        baselines=recommender_data.bias_baseline(train, test),
        data_notes=data_notes,
        **loop_flags.clip_norm_argument(),
    )


def build_trainer():
    """The RetrievalLoop or RatingLoop the flags describe; ValueError for a bad combination."""
    import loops
    from loops.model_dir.export import export_recommender
    from loops_data import recommender_data

    model = loop_flags.setting_values(model_settings.RECOMMENDER)
    arguments = loop_flags.binary_arguments(
        "recommender",
        export=lambda definition, path: export_recommender(
            definition.model,
            path,
            score_all_items=definition.score_all_items,
            score_pairs=definition.score_pairs,
            top_k=model["top_k"],
        ),
        signature="users -> items, scores (top K); score_pairs: users, items -> scores",
    )
    interactions, train, test = _interactions()
    optimizer_fn = training_settings.optimizer_fn(
        loop_flags.setting_values(training_settings.OPTIMIZER),
        learning_rate=FLAGS.learning_rate,
        total_steps=FLAGS.train_steps,
    )
    data_notes = recommender_data.notes(interactions, train, test)
    build = _retrieval if model["model"] == "retrieval" else _rating
    definition = build(model, train, test, optimizer_fn, data_notes)
    data = recommender_data.trainer_data(
        model["model"], train, test, global_batch_size=FLAGS.global_batch_size, seed=FLAGS.seed
    )
    return loops.Trainer(definition, **data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__)

if __name__ == "__main__":
    run()
