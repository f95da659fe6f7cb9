"""Trains an image classifier with ClassifierLoop: `python -m loops.bin.classifier`."""

from __future__ import annotations

from absl import flags

from loops import flags as loop_flags

loop_flags.define_loop_flags(train_steps=600, global_batch_size=64, learning_rate=2e-3)
with loop_flags.heading("data"):
    flags.DEFINE_string(
        "dataset",
        "digits",
        "TFDS image-classification dataset: 'digits' (bundled, offline), 'mnist', 'cifar10', ...",
    )
    flags.DEFINE_string(
        "data_dir",
        None,
        "TFDS data directory (default: ~/tensorflow_datasets), or one prepared TFDS "
        "dataset's folder (DATA_DIR/NAME/VERSION, holding dataset_info.json; --dataset "
        "is then not used).",
    )
    flags.DEFINE_string(
        "image_dir",
        None,
        "A folder of your own images instead of --dataset: IMAGE_DIR/train/CLASS/*.png|jpg "
        "and IMAGE_DIR/test/CLASS/*.png|jpg (TFDS ImageFolder layout).",
    )
    flags.DEFINE_string("train_split", "train", "Split to train on.")
    flags.DEFINE_string("eval_split", "test", "Split to evaluate on.")
    flags.DEFINE_enum(
        "input_from",
        "auto",
        ["auto", "memory", "disk"],
        "memory: read the splits into memory once (fastest for small data); disk: read "
        "each example from its file by index, decode and augment it on the fly (any "
        "size; a resume starts at its step without reading earlier batches); auto: "
        "memory when the train split fits in 1 GiB with no --augment or --image_size.",
    )
    flags.DEFINE_enum(
        "augment",
        "none",
        ["none", "crop_flip"],
        "Train-time augmentation of data read from disk: crop_flip = a random crop of "
        "the image padded by an eighth of its size, flipped half the time, drawn from "
        "(--seed, epoch, example), so a resumed run draws the same.",
    )
    flags.DEFINE_list(
        "image_size",
        None,
        "HEIGHT,WIDTH: resize every image to it (needed for images of mixed sizes).",
    )
with loop_flags.heading("model"):
    flags.DEFINE_enum("model", "mlp", ["mlp", "cnn"], "Classifier network.")
    flags.DEFINE_float("l2", 0.0, "L2 weight regularization factor (>= 0).", lower_bound=0.0)
    flags.DEFINE_bool("batch_norm", False, "Synchronized batch normalization after hidden layers.")
    flags.DEFINE_float(
        "dropout",
        0.0,
        "Dropout rate in [0, 1) after the hidden layers (mlp) or before the head "
        "(cnn); masks differ per replica and per step, and match for any "
        "replica count.",
    )
with loop_flags.heading("training"):
    flags.DEFINE_enum(
        "optimizer",
        "adam",
        ["adam", "sgd", "momentum"],
        "Optimizer: Adam, plain SGD, or SGD with momentum 0.9.",
    )
    flags.DEFINE_enum(
        "lr_schedule",
        "constant",
        ["constant", "step", "cosine", "warmup_cosine"],
        "Learning-rate schedule over the run (peak: --learning_rate).",
    )
    flags.DEFINE_integer(
        "lr_warmup_steps", 0, "warmup_cosine: linear warm-up steps.", lower_bound=0
    )
    flags.DEFINE_integer("lr_step_size", 1000, "step: steps between rate drops.", lower_bound=1)
    flags.DEFINE_float("lr_step_factor", 0.1, "step: factor of each drop, in (0, 1].")
    flags.DEFINE_float(
        "lr_final_fraction",
        0.0,
        "cosine, warmup_cosine: final rate as a fraction of --learning_rate.",
    )
loop_flags.define_export_dir_flag(
    "the trained classifier (raw images in, logits and probabilities out)"
)
flags.register_validator(
    "dropout",
    lambda value: 0.0 <= value < 1.0,
    message="--dropout must lie in [0, 1), e.g. --dropout=0.2.",
)

FLAGS = flags.FLAGS


def make_optimizer(name: str, learning_rate):
    """Adam, SGD or SGD with momentum at `learning_rate` (a float or a schedule)."""
    import keras

    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    return keras.optimizers.SGD(learning_rate, momentum=0.9 if name == "momentum" else 0.0)


def build_loop():
    """The ClassifierLoop the flags describe; ValueError for a bad combination."""
    import loops
    import loops_models as models
    from loops import schedules

    learning_rate = schedules.make_schedule(
        FLAGS.lr_schedule,
        learning_rate=FLAGS.learning_rate,
        total_steps=FLAGS.train_steps,
        warmup_steps=FLAGS.lr_warmup_steps,
        step_size=FLAGS.lr_step_size,
        step_factor=FLAGS.lr_step_factor,
        final_fraction=FLAGS.lr_final_fraction,
    )
    strategy = loop_flags.make_strategy()
    loop_flags.check_batch_fits_replicas(strategy)
    from loops_data import image_streams

    if FLAGS.image_dir is not None and (FLAGS["dataset"].present or FLAGS.data_dir):
        raise ValueError(
            f"--image_dir={FLAGS.image_dir} replaces --dataset and --data_dir; pass "
            "one source of data."
        )
    spec, train_data, eval_data = image_streams.classification_input(
        dataset=FLAGS.dataset,
        data_dir=FLAGS.data_dir,
        image_dir=FLAGS.image_dir,
        train_split=FLAGS.train_split,
        eval_split=FLAGS.eval_split,
        global_batch_size=FLAGS.global_batch_size,
        seed=FLAGS.seed,
        input_from=FLAGS.input_from,
        augment=FLAGS.augment,
        image_size=_image_size(FLAGS.image_size),
    )
    # Fail now, with the data error, rather than inside the first traced step.
    train_data(), eval_data()

    return loops.ClassifierLoop(
        model_fn=lambda: models.build_classifier(
            FLAGS.model,
            input_shape=spec.input_shape,
            num_classes=spec.num_classes,
            l2=FLAGS.l2,
            batch_norm=FLAGS.batch_norm,
            dropout=FLAGS.dropout,
            seed=FLAGS.seed,
        ),
        optimizer_fn=lambda: make_optimizer(FLAGS.optimizer, learning_rate),
        clip_norm=FLAGS.clip_norm,
        train_data=train_data,
        eval_data=eval_data,
        **loop_flags.loop_arguments(
            strategy,
            loop_flags.resolve_model_dir("classifier"),
            actions=[
                loops.ExportOnEnd(
                    export, description="signature serving_default: images -> logits, probabilities"
                )
            ],
        ),
    )


def _image_size(value: list[str] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        height, width = (int(part) for part in value)
    except ValueError:
        height = width = 0
    if height < 1 or width < 1:
        raise ValueError(
            f"--image_size={','.join(value)} is not HEIGHT,WIDTH in pixels; pass two "
            "whole numbers >= 1, e.g. --image_size=32,32."
        )
    return height, width


def export(loop) -> str:
    """Exports the trained model to --export_dir; returns the path."""
    from loops.export import export_classifier

    return export_classifier(loop.model, loop_flags.resolve_export_dir(loop))


def main(argv):
    loop_flags.run_binary(argv, build_loop)


def run():
    """Console-script entry point (loops-classifier)."""
    loop_flags.run(main, description=__doc__)


if __name__ == "__main__":
    run()
