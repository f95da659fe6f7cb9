"""Pictures at each evaluation: the classifier's confusion matrix and worst images, the ring
GAN's scatter of samples; array eval outputs (an array Sum, loops.Highest); the pictures and
the confusion matrix's plot."""

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import SUBPROCESS_ENV, make_trainer, read_results, tiny_batches, tiny_examples
from loops import topology
from loops.core import outputs, pictures, plots
from loops.kinds import gan
from loops_data.ring import Ring
from loops_models import gan as gan_models

EVAL_EXAMPLES = 21  # tiny_batches(8, 21): batches of 8, 8, 5


def make_classifier(num_replicas, model_dir=None, **kwargs):
    kwargs.setdefault(
        "model_fn",
        lambda: models.build_classifier("mlp", input_shape=(8, 8, 1), num_classes=10, seed=7),
    )
    return make_trainer(
        loops.ClassifierLoop,
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(num_replicas),
        train_data=tiny_batches(8, 21, shuffle_seed=2),
        eval_data=tiny_batches(8, EVAL_EXAMPLES, seed=1),
        steps_per_loop=3,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def make_ring_gan(model_dir):
    return make_trainer(
        gan.GANLoop,
        generator_fn=lambda: gan_models.ring_generator(hidden_units=(16,), seed=4),
        discriminator_fn=lambda: gan_models.ring_discriminator(hidden_units=(16,), seed=4),
        generator_optimizer_fn=lambda: keras.optimizers.Adam(0.01, beta_1=0.5),
        discriminator_optimizer_fn=lambda: keras.optimizers.Adam(0.01, beta_1=0.5),
        sample_metrics=Ring().quality,
        num_eval_samples=300,
        scatter_marks=Ring().centers(),
        ema_decay=0.9,
        train_data=lambda: Ring().global_batches(16, seed=3),
        steps_per_loop=2,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
    )


def event_values(model_dir, name="eval"):
    """tag -> [(step, tensor as numpy)] of every summary in model_dir/summaries/name."""
    values = {}
    for path in glob.glob(os.path.join(model_dir, "summaries", name, "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.setdefault(value.tag, []).append((event.step, tf.make_ndarray(value.tensor)))
    return values


def event_image(values, tag):
    """The last image summary of `tag`: its (width, height) as written and the decoded PNG."""
    _, tensor = values[tag][-1]
    width, height, png = tensor
    return (int(width), int(height)), tf.io.decode_png(png).numpy()


# ---- The classifier. ----


@pytest.fixture(scope="module")
def evaluations():
    """num_replicas -> (trainer, evaluate()) after 3 steps; 4 replicas hold [2, 1, 1, 1] last."""
    runs = {}
    for replicas in (1, 2, 4):
        trainer = make_classifier(replicas)
        trainer.train(3)
        runs[replicas] = (trainer, trainer.evaluate())
    return runs


def test_the_confusion_matrix_counts_the_eval_set_and_its_diagonal_is_the_accuracy(evaluations):
    trainer, metrics = evaluations[1]
    assert set(metrics) == {"loss", "accuracy", "num_examples"}  # the metrics stay numbers
    matrix = trainer.definition.last_eval_arrays["confusion_matrix"]
    assert matrix.shape == (10, 10) and matrix.dtype == np.int64
    assert matrix.sum() == metrics["num_examples"] == EVAL_EXAMPLES
    assert np.trace(matrix) / matrix.sum() == pytest.approx(metrics["accuracy"], rel=1e-6)
    _, labels = tiny_examples(EVAL_EXAMPLES, seed=1)
    np.testing.assert_array_equal(matrix.sum(axis=1), np.bincount(labels, minlength=10))


def test_the_confusion_matrix_and_worst_images_are_identical_on_1_2_and_4_replicas(evaluations):
    reference = evaluations[1][0].definition.last_eval_arrays
    for replicas in (2, 4):
        arrays = evaluations[replicas][0].definition.last_eval_arrays
        assert sorted(arrays) == ["confusion_matrix", "worst_classes", "worst_images"]
        for name, array in arrays.items():
            np.testing.assert_array_equal(array, reference[name], err_msg=name)


def test_the_worst_images_are_the_eval_examples_of_highest_loss(evaluations):
    arrays = evaluations[2][0].definition.last_eval_arrays
    images, labels = tiny_examples(EVAL_EXAMPLES, seed=1)
    logits = evaluations[2][0].definition.model(images, training=False)
    losses = loops.sparse_softmax_cross_entropy(labels, logits).numpy()
    order = np.argsort(-losses, kind="stable")[:16]
    assert arrays["worst_images"].shape == (16, 8, 8, 1)
    assert arrays["worst_images"].dtype == np.uint8
    np.testing.assert_array_equal(arrays["worst_images"], images[order])
    predicted = np.argmax(logits, axis=-1)
    np.testing.assert_array_equal(
        arrays["worst_classes"], np.stack([labels[order], predicted[order]], axis=1)
    )


def test_tensorboard_and_results_hold_the_pictures_and_the_matrix(tmp_path):
    model_dir = str(tmp_path)
    names = [f"c{index}" for index in range(10)]
    trainer = make_classifier(2, model_dir, eval_every=3, worst_images=5, class_names=names)
    trainer.train(3)
    matrix = np.array(read_results(model_dir)["confusion_matrix"])
    np.testing.assert_array_equal(matrix, trainer.definition.last_eval_arrays["confusion_matrix"])
    assert matrix.sum() == EVAL_EXAMPLES
    # The run's reports hold its numbers; the arrays are the classifier's to draw.
    assert set(read_results(model_dir)["eval"]) == {"loss", "accuracy", "num_examples"}
    values = event_values(model_dir)
    assert [step for step, _ in values["confusion_matrix"]] == [3]
    # The matrix's plot, 6 inches a side for 10 classes; 5 images of 8 x 8 in rows of 3.
    size, plot = event_image(values, "confusion_matrix")
    assert size == (600, 600) and plot.shape == (600, 600, 4)
    expected = plots.png_bytes(plots.confusion_matrix_figure(matrix, names))
    np.testing.assert_array_equal(plot, tf.io.decode_png(expected).numpy())
    size, grid = event_image(values, "worst_images")
    assert size == (28, 19) and grid.shape == (19, 28, 1)
    (_, text) = values["worst_classes"][-1]
    assert text.item().decode().split(": ")[1].count(" -> ") == 5


def test_a_classifier_of_features_counts_its_matrix_and_draws_no_grid(tmp_path):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(EVAL_EXAMPLES, 5)).astype(np.float32)
    labels = rng.integers(0, 3, EVAL_EXAMPLES).astype(np.int32)

    def data():
        return tf.data.Dataset.from_tensor_slices((features, labels)).batch(8)

    trainer = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: keras.Sequential(
                [keras.Input((5,)), keras.layers.Dense(3, kernel_initializer="zeros")]
            ),
            optimizer_fn=lambda: keras.optimizers.SGD(0.1),
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=data,
        eval_data=data,
        model_dir=str(tmp_path),
        progress=loops.testing.quiet_progress(),
    )
    metrics = trainer.evaluate()
    arrays = trainer.definition.last_eval_arrays
    # Zero weights: every logit ties and argmax predicts class 0.
    expected = np.zeros((3, 3), np.int64)
    expected[:, 0] = np.bincount(labels, minlength=3)
    np.testing.assert_array_equal(arrays["confusion_matrix"], expected)
    assert metrics["accuracy"] == pytest.approx(expected[0, 0] / EVAL_EXAMPLES, rel=1e-6)
    assert sorted(arrays) == ["confusion_matrix"]
    values = event_values(str(tmp_path))
    assert "confusion_matrix" in values and "worst_images" not in values


def test_only_the_chief_writes_the_pictures(tmp_path, monkeypatch):
    """A worker that is not the chief has no summary writer (the GAN grid's rule)."""
    monkeypatch.setattr(topology, "is_chief", lambda strategy: False)
    classifier = make_classifier(1, str(tmp_path / "classifier"))
    classifier.evaluate()
    assert classifier.definition.last_eval_arrays["confusion_matrix"].sum() == EVAL_EXAMPLES
    ring = make_ring_gan(str(tmp_path / "ring"))
    ring.evaluate()
    assert ring.definition.sample_files == []
    for model_dir in ("classifier", "ring"):
        written = glob.glob(str(tmp_path / model_dir / "**" / "*"), recursive=True)
        assert not [path for path in written if "events." in path or path.endswith(".png")]


# ---- The ring GAN. ----


def test_the_ring_gan_writes_a_scatter_of_its_samples_over_the_modes(tmp_path):
    model_dir = str(tmp_path)
    trainer = make_ring_gan(model_dir)
    trainer.train(2)  # ends with an evaluation: the averaged and the raw generator's samples
    loop = trainer.definition
    with loop.averaged_weights():
        averaged = loop.sample(300)
        with loop.raw_weights():
            raw = loop.sample(300)
    values = event_values(model_dir)
    for tag, samples in (("samples", averaged), ("raw_samples", raw)):
        size, image = event_image(values, tag)
        assert size == (256, 256)
        np.testing.assert_array_equal(image, pictures.scatter_image(samples, Ring().centers()))
        png = tf.io.read_file(os.path.join(model_dir, f"{tag}-000002.png"))
        np.testing.assert_array_equal(tf.io.decode_png(png).numpy(), image)
    assert not np.array_equal(averaged, raw)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(scatter_marks=np.zeros((8, 3))), "scatter_marks must be finite points of shape"),
        (dict(scatter_marks=np.zeros((0, 2))), "scatter_marks must be finite points of shape"),
        (dict(scatter_marks=[[0.0, np.nan]]), "scatter_marks must be finite points of shape"),
        (dict(scatter_marks=np.zeros((1, 2)), sample_grid=(2, 2)), "pass one of them"),
    ],
)
def test_bad_scatter_marks_name_the_fix(arguments, message):
    with pytest.raises(ValueError, match=message):
        gan.GANLoop(
            generator_fn=None,
            discriminator_fn=None,
            generator_optimizer_fn=None,
            discriminator_optimizer_fn=None,
            **arguments,
        )


def test_scatter_marks_need_a_generator_of_points():
    trainer_arguments = dict(
        generator_fn=lambda: gan_models.image_generator(noise_dim=8, filters=8, seed=4),
        discriminator_fn=lambda: gan_models.image_discriminator(filters=4, seed=4),
        generator_optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        discriminator_optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        scatter_marks=Ring().centers(),
        train_data=lambda: tf.data.Dataset.from_tensors(tf.zeros([4, 8, 8, 1])),
    )
    with pytest.raises(ValueError, match="scatter_marks needs a generator of 2-D points"):
        make_trainer(gan.GANLoop, **trainer_arguments)


# ---- Array eval outputs. ----


def accumulated(keep, batches):
    """A Highest accumulated over (scores, rows) batches as an eval pass does, then finished."""
    kinds, totals = None, None
    for scores, rows in batches:
        flat, kinds = outputs.columns(
            {"worst": loops.Highest(tf.constant(scores), tf.constant(rows), keep)},
            "eval_step",
            arrays=True,
        )
        totals = outputs.accumulate(kinds, totals or outputs.start_totals(kinds, flat), flat)
    return outputs.finish_totals(kinds, {name: value.numpy() for name, value in totals.items()})


def test_highest_keeps_the_rows_of_highest_score_the_earlier_first_on_ties():
    batches = [([1.0, 5.0, 3.0], [[1], [2], [3]]), ([5.0, 0.0], [[4], [5]])]
    np.testing.assert_array_equal(accumulated(3, batches)["worst"], [[2], [4], [3]])
    # Fewer rows than kept: all of them, highest first.
    np.testing.assert_array_equal(accumulated(9, batches)["worst"], [[2], [4], [3], [1], [5]])


@pytest.mark.parametrize(
    "output, message",
    [
        (loops.Sum(tf.zeros([2, 2])), "an eval step may return an array loops.Sum"),
        (loops.Highest(tf.zeros([2]), tf.zeros([2, 3]), 1), "only an eval step may"),
    ],
)
def test_a_train_step_returns_scalars_only(output, message):
    with pytest.raises(TypeError, match=message):
        outputs.columns({"value": output}, "train_step")


# ---- The pictures. ----


def test_the_confusion_matrix_plot_names_the_classes_and_writes_each_count():
    counts = np.array([[5, 0, 1], [2, 7, 0], [0, 3, 9]])
    figure = plots.confusion_matrix_figure(counts, ["cat", "dog", "a very long class name"])
    (axes,) = figure.axes
    assert axes.get_xlabel() == "predicted class" and axes.get_ylabel() == "true class"
    assert axes.get_title() == "Confusion matrix of 27 examples"
    names = ["cat", "dog", "a very long c..."]
    assert [label.get_text() for label in axes.get_xticklabels()] == names
    assert [label.get_text() for label in axes.get_yticklabels()] == names
    # Row by row, the true class down and the predicted one across.
    cells = {
        (text.get_position()[1], text.get_position()[0]): text.get_text() for text in axes.texts
    }
    assert cells == {
        (row, column): str(counts[row, column]) for row in range(3) for column in range(3)
    }
    # The largest count on the darkest shade, white on it; a 0 black on white.
    assert {text.get_text(): text.get_color() for text in axes.texts}["9"] == "white"
    assert {text.get_text(): text.get_color() for text in axes.texts}["0"] == "black"
    png = plots.png_bytes(figure)
    assert tf.io.decode_png(png).shape == (400, 400, 4)  # 4 inches at 100 pixels an inch
    # Drawn again from the same counts: the same bytes (no date or version in the file).
    assert (
        plots.png_bytes(
            plots.confusion_matrix_figure(counts, names[:2] + ["a very long class name"])
        )
        == png
    )


def test_the_confusion_matrix_plot_of_many_classes_stays_bounded():
    counts = np.eye(plots.MAX_COUNTED_CLASSES + 1, dtype=np.int64)
    (axes,) = plots.confusion_matrix_figure(counts, None).axes
    assert len(axes.texts) == 0  # cells too small to read: the counts are in results.json
    labels = [label.get_text() for label in axes.get_xticklabels()]
    assert labels == [str(index) for index in range(plots.MAX_COUNTED_CLASSES + 1)]
    (axes,) = plots.confusion_matrix_figure(np.eye(200, dtype=np.int64), None).axes
    assert axes.get_title() == "Confusion matrix of 200 examples"
    assert len(axes.get_xticklabels()) < 20  # matplotlib's own choice of indices
    assert axes.get_figure().get_size_inches().tolist() == [16.0, 16.0]


@pytest.mark.parametrize(
    "class_names, message",
    [
        ("abc", "class_names must be a list of strings, one a class in label order, got 'abc'."),
        ([], "class_names must be a list of strings, one a class in label order, got []."),
        (
            ["a", 2],
            "class_names must be a list of strings, one a class in label order, got ['a', 2].",
        ),
        (
            ["a", "b"],
            "class_names has 2 names but the model gives 10 logits a row; pass one name a class, "
            "in label order.",
        ),
    ],
)
def test_bad_class_names_are_refused_before_training(class_names, message):
    with pytest.raises(ValueError) as refused:
        make_classifier(1, class_names=class_names)
    assert str(refused.value) == message


class SubclassedClassifier(keras.Model):
    """A model whose output width build cannot read (it has no symbolic outputs)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(10)

    def call(self, inputs):
        return self.dense(keras.ops.reshape(inputs, (-1, 64)))


def test_class_names_a_subclassed_model_disagrees_with_are_refused_at_the_first_picture(tmp_path):
    def model_fn():
        model = SubclassedClassifier()
        model(keras.ops.zeros((1, 8, 8, 1)))
        return model

    trainer = make_classifier(1, str(tmp_path), model_fn=model_fn, class_names=["a", "b"])
    with pytest.raises(ValueError) as refused:
        trainer.evaluate()
    assert str(refused.value) == (
        "class_names has 2 names but the model gives 10 logits a row; pass one name a class, "
        "in label order."
    )


def test_plots_use_a_private_config_directory_where_the_home_is_unwritable(tmp_path):
    """matplotlib would say on every run that it made a temporary cache directory (a root run
    writes anywhere, so the home is a file here)."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    environment = {name: value for name, value in SUBPROCESS_ENV.items() if "XDG_" not in name}
    environment.pop("MPLCONFIGDIR", None)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from loops.core import plots; "
            "imported = 'matplotlib' in sys.modules; "
            "plots.png_bytes(plots.confusion_matrix_figure([[1]], None)); "
            "print(os.environ['MPLCONFIGDIR'], os.path.isdir(os.environ['MPLCONFIGDIR']), "
            "imported, 'tensorflow' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        env={**environment, "HOME": str(blocked)},
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    private, existed, imported_early, tensorflow_imported = done.stdout.split()
    assert os.path.basename(private).startswith("loops-matplotlib-") and existed == "True"
    # matplotlib loads with the first plot, not with the module; TensorFlow not at all.
    assert imported_early == "False" and tensorflow_imported == "False"
    assert not os.path.exists(private)  # removed when the process ended


def test_a_grid_tiles_images_in_rows_and_leaves_the_missing_tiles_gray():
    grid = pictures.image_grid(np.full((5, 2, 3, 1), 7, np.uint8), 3)
    assert grid.shape == (2 * 3 + 1, 3 * 4 + 1, 1)
    assert np.all(grid[4:6, 9:12] == 128) and np.all(grid[4:6, 5:8] == 7)
    assert pictures.pixels_from_extremes(np.array([-2.0, 0.0, 2.0])).tolist() == [0, 128, 255]
    assert pictures.pixels_from_extremes(np.array([0.2, 0.8])).tolist() == [0, 255]


def test_a_scatter_puts_points_in_place_and_rings_the_marks():
    marks = np.array([[-1.0, -1.0], [1.0, 1.0]])  # the picture shows [-2, 2] x [-2, 2]
    image = pictures.scatter_image(np.array([[0.0, 0.0], [2.0, 2.0], [50.0, 0.0]]), marks)
    assert image.shape == (256, 256, 3)
    white = np.all(image == 255, axis=-1)
    center = round(255 / 2)
    assert not white[center, center]  # (0, 0) in the middle
    assert not white[0, 255]  # (2, 2): the top right corner
    assert not white[center, 255]  # (50, 0): on the right border
    red = np.all(image == [220, 30, 30], axis=-1)
    mark_row, mark_column = 255 * 3 / 4, 255 / 4  # (-1, -1): down and left
    rows, columns = np.nonzero(red)
    distances = np.hypot(rows - mark_row, columns - mark_column)
    assert red.sum() > 40 and np.all((np.abs(distances - 6) < 1) | (distances > 20))
