"""The bundled digits dataset and the TFDS input path."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import loops_data as data
from conftest import run_python
from loops_data import python_text
from loops_data.ring import Ring


def test_digits_has_a_fixed_split_of_the_bundled_images(digits_dir):
    from sklearn.datasets import load_digits

    spec = data.dataset_spec("digits", digits_dir)
    assert spec.input_shape == (8, 8, 1)
    assert spec.num_classes == 10
    assert spec.class_names == tuple(str(label) for label in range(10))  # ClassLabel names
    assert spec.split_sizes == {"train": 1437, "test": 360}
    images, labels = next(
        iter(data.read_split(data.load_builder("digits", digits_dir), "test").batch(360))
    )
    reference = load_digits()
    assert images.dtype == tf.uint8 and int(tf.reduce_max(images)) == 255
    # The test split is exactly every 5th bundled example (TFDS stores them in its own order).
    expected = np.round(reference.images[::5] * 255 / 16).astype(np.uint8).reshape(360, 64)
    got = images.numpy().reshape(360, 64)

    def by_pixels(rows):
        return rows[np.lexsort(rows.T[::-1])]

    np.testing.assert_array_equal(by_pixels(got), by_pixels(expected))
    assert sorted(labels.numpy().tolist()) == sorted(reference.target[::5].tolist())


def test_global_batches_end_each_epoch_with_a_partial_batch(digits_dir):
    sizes = [
        int(images.shape[0])
        for images, _ in data.global_batches(
            "digits", "train", global_batch_size=64, data_dir=digits_dir
        )
    ]
    assert sizes == [64] * 22 + [29]


def test_shuffling_repeats_for_a_seed_and_changes_per_epoch(digits_dir):
    def first_labels(seed, epochs=2):
        dataset = data.global_batches(
            "digits", "train", global_batch_size=1437, data_dir=digits_dir, shuffle_seed=seed
        ).repeat(epochs)
        return [labels.numpy()[:20].tolist() for _, labels in dataset]

    epoch_one, epoch_two = first_labels(3)
    assert first_labels(3) == [epoch_one, epoch_two]
    assert epoch_one != epoch_two
    assert first_labels(4)[0] != epoch_one


def test_a_tfds_dataset_by_name_through_the_same_path():
    with tfds.testing.mock_data(num_examples=20):
        spec = data.dataset_spec("mnist")
        batches = list(data.global_batches("mnist", "train", global_batch_size=8))
    assert spec.input_shape == (28, 28, 1) and spec.num_classes == 10
    assert [int(images.shape[0]) for images, _ in batches] == [8, 8, 4]
    assert batches[0][0].dtype == tf.uint8 and batches[0][1].shape == (8,)


def test_a_dataset_that_needs_a_download_names_data_dir(tmp_path):
    with pytest.raises(ValueError, match="'mnist' is not prepared.*--data_dir=DIR"):
        data.global_batches("mnist", "train", global_batch_size=8, data_dir=str(tmp_path))


def test_unknown_dataset_and_split_are_named(digits_dir):
    with pytest.raises(ValueError, match="Unknown dataset 'digitz'"):
        data.dataset_spec("digitz")
    with pytest.raises(ValueError, match="Unknown split 'validation'.*--eval_split"):
        data.global_batches("digits", "validation", global_batch_size=8, data_dir=digits_dir)


def test_a_dataset_that_is_not_classification_is_refused():
    with pytest.raises(ValueError, match="is not image classification"):
        data.dataset_spec("glue/cola")


@pytest.mark.parametrize("size", [0, -3, 2.5])
def test_bad_batch_size(size, digits_dir):
    with pytest.raises(
        ValueError, match=f"global_batch_size must be a whole number >= 1, got {size}"
    ):
        data.global_batches("digits", "train", global_batch_size=size, data_dir=digits_dir)


@pytest.mark.parametrize("size", [0, True, 8.0])
def test_the_ring_and_the_python_text_refuse_a_bad_batch_size_as_the_images_do(size):
    sentence = f"^global_batch_size must be a whole number >= 1, got {size!r}\\.$"
    with pytest.raises(ValueError, match=sentence):
        Ring().global_batches(size)
    with pytest.raises(ValueError, match=sentence):
        python_text.global_batches("train", sequence_length=8, global_batch_size=size)


def test_in_memory_batches_take_a_new_full_permutation_each_pass():
    from loops_data.in_memory import batches_in_memory

    rows = np.arange(50)
    dataset = batches_in_memory((rows, rows * 10), 8, shuffle_seed=7).repeat(3)
    batches = [(a.numpy(), b.numpy()) for a, b in dataset]
    assert [len(a) for a, _ in batches] == ([8] * 6 + [2]) * 3
    assert dataset.options().autotune.enabled is False  # nothing to tune (BUILD.md fact 29)
    assert all(np.array_equal(a * 10, b) for a, b in batches)  # rows stay whole
    epochs = [np.concatenate([a for a, _ in batches[i * 7 : (i + 1) * 7]]) for i in range(3)]
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(50))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    again = [
        a.numpy() for a, _ in batches_in_memory((rows, rows * 10), 8, shuffle_seed=7).repeat(3)
    ]
    assert all(np.array_equal(a, b) for a, b in zip(again, (a for a, _ in batches)))
    # Skipping k batches of the repeated stream lands where a run that stopped after k was.
    resumed = batches_in_memory((rows, rows * 10), 8, shuffle_seed=7).repeat().skip(10)
    assert np.array_equal(next(iter(resumed))[0].numpy(), batches[10][0])
    unshuffled = [a.numpy().tolist() for a, _ in batches_in_memory((rows, rows), 16)]
    assert unshuffled == [list(range(0, 16)), list(range(16, 32)), list(range(32, 48)), [48, 49]]


def test_endless_batches_are_full_static_and_a_new_permutation_each_pass(monkeypatch):
    from loops_data import in_memory
    from loops_data.in_memory import endless_batches_in_memory

    rows = np.arange(50)
    monkeypatch.setattr(in_memory, "ROWS_PER_DRAW", 120)  # two passes a draw
    dataset = endless_batches_in_memory((rows, rows * 10), 8, shuffle_seed=7)
    assert [spec.shape.as_list() for spec in dataset.element_spec] == [[8], [8]]
    assert dataset.options().autotune.enabled is False
    batches = [(a.numpy(), b.numpy()) for a, b in dataset.take(25)]  # 200 rows: 4 passes
    assert all(np.array_equal(a * 10, b) for a, b in batches)  # rows stay whole
    flat = np.concatenate([a for a, _ in batches])
    passes = [flat[i * 50 : (i + 1) * 50] for i in range(4)]
    for one_pass in passes:
        assert sorted(one_pass.tolist()) == list(range(50))
    assert len({tuple(one_pass) for one_pass in passes}) == 4
    # The same sequence every run, and skipping k batches resumes exactly.
    again = endless_batches_in_memory((rows, rows * 10), 8, shuffle_seed=7)
    assert np.array_equal(np.concatenate([a.numpy() for a, _ in again.take(25)]), flat)
    resumed = next(iter(again.skip(13)))[0].numpy()
    assert np.array_equal(resumed, batches[13][0])
    unshuffled = [
        a.numpy().tolist() for a, _ in endless_batches_in_memory((rows, rows), 16).take(4)
    ]
    assert unshuffled[3] == [48, 49, *range(14)]
    with pytest.raises(ValueError, match="No rows to batch"):
        endless_batches_in_memory((rows[:0],), 8)


def test_repeated_splits_give_full_batches_in_memory_and_streaming(digits_dir, monkeypatch):
    from loops_data import image_classification

    def labels_of(dataset, count):
        assert dataset.element_spec[0].shape.as_list() == [64, 8, 8, 1]
        return np.concatenate([labels.numpy() for _, labels in dataset.take(count)])

    in_memory = labels_of(
        data.global_batches(
            "digits",
            "train",
            global_batch_size=64,
            data_dir=digits_dir,
            shuffle_seed=1,
            repeat=True,
        ),
        45,
    )
    monkeypatch.setattr(image_classification, "IN_MEMORY_BYTES", 0)
    streamed = labels_of(
        data.global_batches(
            "digits",
            "train",
            global_batch_size=64,
            data_dir=digits_dir,
            shuffle_seed=1,
            repeat=True,
        ),
        45,
    )
    # 45 batches are 2880 rows: two whole passes of the 1437 and 6 rows of a third.
    for labels in (in_memory, streamed):
        assert np.array_equal(np.sort(labels[:1437]), np.sort(labels[1437:2874]))


def test_a_split_too_large_for_memory_streams_through_a_shuffle_buffer(digits_dir, monkeypatch):
    from loops_data import image_classification

    monkeypatch.setattr(image_classification, "IN_MEMORY_BYTES", 0)
    dataset = data.global_batches(
        "digits", "train", global_batch_size=64, data_dir=digits_dir, shuffle_seed=1
    )
    labels = np.concatenate([labels.numpy() for _, labels in dataset])
    monkeypatch.undo()
    in_memory = data.global_batches("digits", "train", global_batch_size=64, data_dir=digits_dir)
    expected = np.concatenate([labels.numpy() for _, labels in in_memory])
    assert len(labels) == 1437 and sorted(labels.tolist()) == sorted(expected.tolist())
    assert not np.array_equal(labels, expected)  # shuffled


def test_the_logs_read_into_memory_load_without_tensorflow_datasets():
    # Its import is a quarter of a second of each recommender, click or text process.
    done = run_python(
        "import sys\n"
        "from loops_data import ctr_data, ctr_tables, python_text, recommender_data\n"
        "print(sorted(m for m in sys.modules if m.startswith('tensorflow_datasets')))"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
