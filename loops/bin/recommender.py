"""Trains a recommender on an interaction log (retrieval or rating): `python -m
loops.bin.recommender`."""

from absl import flags

from loops.bin import binary_flags, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops_data import recommender_training
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.RECOMMENDER.define()
FLAGS = flags.FLAGS


def _training() -> recommender_training.RecommenderTraining:
    """The training the flags describe; its optimizers made once its log is read and checked."""
    optimizer = loop_flags.setting_values(training_settings.OPTIMIZER)
    return recommender_training.RecommenderTraining(
        loop_flags.setting_values(model_settings.RECOMMENDER),
        loop_flags.setting_values(data_settings.INTERACTIONS),
        seed=FLAGS.seed,
        global_batch_size=FLAGS.global_batch_size,
        optimizers=training_settings.flag_optimizers(),
        weight_copies=training_settings.weight_copies(optimizer),
        warm_start=loop_flags.setting_values(training_settings.WARM_START),
        model_dir=FLAGS.model_dir,
        **loop_flags.clip_norm_argument(),
    )


def _prepare() -> None:
    """Refuses --placed_tables or --dynamic_ids without a table optimizer of their own
    (`check_dynamic_ids`), a --warm_start_from or --continue_from that cannot be one
    (`check_warm_start`), --export_deltas without the export it follows (`delta_base`) and
    what a log of shards cannot do (`RecommenderTraining.check_streamable`); fills in --data
    as an absolute path and the metric kept best (`RecommenderTraining.filled_in`)."""
    tables = loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    training_settings.check_placed_tables(tables)
    recommender_training.check_dynamic_ids(
        loop_flags.setting_values(model_settings.RECOMMENDER),
        tables["table_optimizer"],
        FLAGS.strategy,
        loop_flags.num_replicas(),
        FLAGS.parameter_server_mode,
    )
    starts = loop_flags.setting_values(training_settings.WARM_START)
    training_settings.check_warm_start(starts, FLAGS.model_dir)
    training_settings.delta_base(starts)
    training = _training()
    training.check_streamable()
    loop_flags.set_values(training.filled_in(FLAGS.keep_best_metric))


def build_trainer():
    """The RetrievalLoop or RatingLoop the flags describe; ValueError for a bad combination
    (a continued run's step: `check_continued_steps`)."""
    training = _training()
    starts = loop_flags.setting_values(training_settings.WARM_START)
    # The strategy first (`binary_arguments` makes it): it sets up the devices before any
    # other TensorFlow work, which reading the rows for a start's remap may do.
    # The export, ids.json and the final test read the log once training starts or ends.
    arguments = loop_flags.binary_arguments(
        "recommender",
        **training.outputs(FLAGS.keep_best_metric),
        deltas_from=training_settings.delta_base(starts),
    )
    training_settings.check_continued_steps(training.warm_start(), FLAGS.train_steps)
    return training.trainer(arguments, model_dir=FLAGS.model_dir)


main, run = application.entry_points(build_trainer, description=__doc__, prepare=_prepare)

if __name__ == "__main__":
    run()
