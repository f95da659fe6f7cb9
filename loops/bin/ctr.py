"""Trains a click-through model (wide & deep, DCN-v2 or DLRM) on a feature table: `python -m
loops.bin.ctr`."""

from absl import flags

from loops.bin import binary_flags, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops.cluster import cluster_config
from loops_data import ctr_training
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.CTR.define()
FLAGS = flags.FLAGS
_checked: dict = {}  # what `_prepare` read before TensorFlow started, which training reads


def _training() -> ctr_training.CTRTraining:
    """The training the flags describe; its optimizers made once its rows are split."""
    optimizer = loop_flags.setting_values(training_settings.OPTIMIZER)
    tables = loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    copies = training_settings.table_weight_copies(optimizer, tables)
    return ctr_training.CTRTraining(
        loop_flags.setting_values(data_settings.CTR_DATA),
        loop_flags.setting_values(model_settings.CTR),
        seed=FLAGS.seed,
        global_batch_size=FLAGS.global_batch_size,
        optimizers=training_settings.flag_optimizers(),
        weight_copies=(copies, training_settings.weight_copies(optimizer)),
        warm_start=loop_flags.setting_values(training_settings.WARM_START),
        checked=_checked,
        # The workers of a cluster split the statistics pass of a log of shards.
        pass_worker=cluster_config.pass_worker(FLAGS.strategy),
        **loop_flags.clip_norm_argument(),
    )


def _prepare() -> None:
    """Refuses, before TensorFlow starts, --placed_tables without a table optimizer of their
    own, a --warm_start_from or --continue_from that cannot be one (`check_warm_start`),
    --export_deltas without the export it follows (`delta_base`) and what
    `CTRTraining.check` refuses; fills in `CTRTraining.filled_in`."""
    training_settings.check_placed_tables(
        loop_flags.setting_values(training_settings.TABLE_OPTIMIZER)
    )
    starts = loop_flags.setting_values(training_settings.WARM_START)
    training_settings.check_warm_start(starts, FLAGS.model_dir)
    training_settings.delta_base(starts)
    training = _training()
    loop_flags.set_values(training.filled_in(FLAGS.keep_best_metric))
    training.check(FLAGS.model_dir)


def build_trainer():
    """The CTRLoop the flags describe; ValueError for a bad combination (a continued run's
    step: `check_continued_steps`)."""
    training = _training()
    starts = loop_flags.setting_values(training_settings.WARM_START)
    # The strategy first (`binary_arguments` makes it): it sets up the devices before any
    # other TensorFlow work, which reading the rows for a start's remap may do.
    arguments = loop_flags.binary_arguments(
        "ctr",
        **training.outputs(FLAGS.keep_best_metric),
        deltas_from=training_settings.delta_base(starts),
    )
    training_settings.check_continued_steps(training.warm_start(), FLAGS.train_steps)
    return training.trainer(arguments, model_dir=FLAGS.model_dir)


main, run = application.entry_points(build_trainer, description=__doc__, prepare=_prepare)

if __name__ == "__main__":
    run()
