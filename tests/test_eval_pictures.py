"""Pictures at each evaluation: the classifier's confusion matrix and worst images, the ring
GAN's scatter of samples; array eval outputs (an array Sum, loops.Highest); the pictures."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import make_trainer, read_results, tiny_batches, tiny_examples
from loops import topology
from loops.core import outputs, pictures
from loops.kinds import gan
from loops_data.ring import Ring
from loops_models import gan as gan_models

EVAL_EXAMPLES = 21  # tiny_batches(8, 21): batches of 8, 8, 5


def make_classifier(num_replicas, model_dir=None, **kwargs):
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.build_classifier(
            "mlp", input_shape=(8, 8, 1), num_classes=10, seed=7
        ),
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
    trainer = make_classifier(2, model_dir, eval_every=3, worst_images=5)
    trainer.train(3)
    matrix = np.array(read_results(model_dir)["confusion_matrix"])
    np.testing.assert_array_equal(matrix, trainer.definition.last_eval_arrays["confusion_matrix"])
    assert matrix.sum() == EVAL_EXAMPLES
    # The run's reports hold its numbers; the arrays are the classifier's to draw.
    assert set(read_results(model_dir)["eval"]) == {"loss", "accuracy", "num_examples"}
    values = event_values(model_dir)
    assert [step for step, _ in values["confusion_matrix"]] == [3]
    # 10 classes of 25 x 25 pixels; 5 images of 8 x 8 in rows of 3, 1-pixel lines.
    size, heatmap = event_image(values, "confusion_matrix")
    assert size == (250, 250) and heatmap.shape == (250, 250, 3)
    size, grid = event_image(values, "worst_images")
    assert size == (28, 19) and grid.shape == (19, 28, 1)
    # The darkest cell is the matrix's largest count.
    row, column = np.unravel_index(np.argmax(matrix), matrix.shape)
    assert heatmap[row * 25 + 12, column * 25 + 12].tolist() == [8, 48, 107]
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


def test_a_heatmap_shades_counts_from_white_to_dark_blue_on_a_log_scale():
    image = pictures.heatmap(np.array([[0, 1], [99, 9999]]))
    assert image.shape == (250, 250, 3) and image.dtype == np.uint8
    assert image[0, 0].tolist() == [255, 255, 255] and image[-1, -1].tolist() == [8, 48, 107]
    one, many = image[0, 125], image[125, 0]  # log 2 / log 10000: light; log 100: half
    assert 200 < one[0] < 255 and 100 < many[0] < 160


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
