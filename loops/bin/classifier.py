"""Trains an image classifier with ClassifierLoop: `python -m loops.bin.classifier`."""

from __future__ import annotations

from absl import flags

from loops.bin import binary_flags, flag_checks, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops_data import settings as data_settings
from loops_models import settings as model_settings

binary_flags.CLASSIFIER.define()
FLAGS = flags.FLAGS


def build_trainer():
    """The ClassifierLoop the flags describe; ValueError for a bad combination."""
    import loops
    import loops_models as models
    from loops.model_dir.classifier_export import export_classifier
    from loops_data import image_folders, image_streams

    arguments = loop_flags.binary_arguments(
        "classifier",
        export=lambda definition, path: export_classifier(definition.model, path),
        signature="images -> logits, probabilities",
    )
    data = loop_flags.setting_values(data_settings.IMAGE_CLASSIFICATION)
    spec, train_data, eval_data = image_streams.classification_input(
        **data, global_batch_size=FLAGS.global_batch_size, seed=FLAGS.seed, say=loop_flags.say
    )
    train_data(), eval_data()  # fail now, with the data error, not inside the first step
    model = loop_flags.setting_values(model_settings.CLASSIFIER)
    name = model.pop("model")
    model.update(input_shape=spec.input_shape, num_classes=spec.num_classes, seed=FLAGS.seed)
    definition = loops.ClassifierLoop(
        model_fn=lambda: models.build_classifier(name, **model),
        optimizer_fn=training_settings.optimizer_fn(
            loop_flags.setting_values(training_settings.OPTIMIZER),
            learning_rate=FLAGS.learning_rate,
            total_steps=FLAGS.train_steps,
        ),
        data_notes=image_folders.left_out_notes(spec.left_out),
        class_names=spec.class_names or None,
        **loop_flags.clip_norm_argument(),
    )
    return loops.Trainer(definition, train_data=train_data, eval_data=eval_data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__, **flag_checks.CLASSIFIER)

if __name__ == "__main__":
    run()
