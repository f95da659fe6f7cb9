"""Trains an image classifier with ClassifierLoop: `python -m loops.bin.classifier`."""

from __future__ import annotations

from absl import app, flags

from loops.bin import training_settings
from loops.cli import flags as loop_flags
from loops_data import settings as data_settings
from loops_models import settings as model_settings

loop_flags.define_binary_flags(
    (data_settings.IMAGE_CLASSIFICATION, model_settings.CLASSIFIER, training_settings.OPTIMIZER),
    export="the trained classifier (raw images in, logits and probabilities out)",
    train_steps=600,
    global_batch_size=64,
    learning_rate=2e-3,
)
FLAGS = flags.FLAGS


def build_loop():
    """The ClassifierLoop the flags describe; ValueError for a bad combination."""
    import loops
    import loops_models as models
    from loops.model_dir.export import export_classifier
    from loops_data import image_streams

    arguments = loop_flags.binary_arguments(
        "classifier",
        export=lambda loop, path: export_classifier(loop.model, path),
        signature="images -> logits, probabilities",
    )
    spec, train_data, eval_data = image_streams.classification_input(
        **loop_flags.setting_values(data_settings.IMAGE_CLASSIFICATION),
        global_batch_size=FLAGS.global_batch_size,
        seed=FLAGS.seed,
        say=lambda line: print(line, flush=True),
    )
    train_data(), eval_data()  # fail now, with the data error, not inside the first step
    model = loop_flags.setting_values(model_settings.CLASSIFIER)
    name = model.pop("model")
    model.update(input_shape=spec.input_shape, num_classes=spec.num_classes, seed=FLAGS.seed)
    return loops.ClassifierLoop(
        model_fn=lambda: models.build_classifier(name, **model),
        optimizer_fn=training_settings.optimizer_fn(
            loop_flags.setting_values(training_settings.OPTIMIZER),
            learning_rate=FLAGS.learning_rate,
            total_steps=FLAGS.train_steps,
        ),
        train_data=train_data,
        eval_data=eval_data,
        data_notes=left_out_notes(spec.left_out),
        **arguments,
    )


# results.json names this many of the files --skip_bad_images left out, and counts all.
NAMED_LEFT_OUT = 100


def left_out_notes(left_out: tuple[tuple[str, str], ...]) -> dict:
    """results.json's "data" entry for the files left out; {} when none were."""
    if not left_out:
        return {}
    return {
        "left_out_images": len(left_out),
        "left_out": [{"path": path, "why": why} for path, why in left_out[:NAMED_LEFT_OUT]],
    }


def check_data_flags() -> None:
    """Refuses two sources of data, or --skip_bad_images without --image_dir, before TensorFlow."""
    try:
        data_settings.check_one_image_source(
            loop_flags.setting_values(data_settings.IMAGE_CLASSIFICATION),
            dataset_given=FLAGS["dataset"].present,
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from error


def explain_failure(loop, error: Exception) -> str | None:
    """An --image_dir file that stopped decoding during training, named; None for any other error.

    The check before training decoded every file, so a failure now is a file
    changed since: the check, run again, decodes the changed files and names them.
    """
    from loops_data import image_folders

    if FLAGS.image_dir is None:
        return None
    left_out = frozenset(entry["path"] for entry in loop.data_notes.get("left_out", ()))
    changed = image_folders.changed_files(
        FLAGS.image_dir, (FLAGS.train_split, FLAGS.eval_split), trained_without=left_out
    )
    if not changed:
        return None
    files = "; ".join(f"{path} {why}" for path, why in changed.items())
    newest = loop.checkpointer.latest if loop.checkpointer is not None else None
    resume = (
        f"it goes on from {newest}" if newest else "no checkpoint was saved yet: it starts over"
    )
    return (
        "training stopped: an image changed after the check before training and no longer "
        f"decodes: {files}. Replace or remove it, then run the same command again ({resume})."
    )


main, run = loop_flags.entry_points(
    build_loop, description=__doc__, prepare=check_data_flags, explain_failure=explain_failure
)

if __name__ == "__main__":
    run()
