"""Data read from disk by index: exact resume at any position, image folders, clear errors."""

import hashlib
import os
import shutil
import signal
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from test_launch import ENV, RTOL, Run, largest_weight_difference

from conftest import ROOT, checkpoint_weights, read_results, run_module
from loops.input import distributed_input, random_access
from loops.vocabulary import exit_codes
from loops_data import colored_digits, image_folders, image_streams

TRAIN_EXAMPLES = 600  # 18.75 batches of 32: steps 19, 38 and 57 each start a new epoch
BATCH = 32
STEPS = 60


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory):
    """A generated TFDS dataset of JPEG-encoded 32x32x3 images in 4 TFRecord shards."""
    return colored_digits.generate(
        str(tmp_path_factory.mktemp("colored_digits")),
        train_examples=TRAIN_EXAMPLES,
        test_examples=100,
        num_shards=4,
    )


def streams(dataset_dir, augment="crop_flip", seed=7, input_nice=0):
    return image_streams.from_tfds_directory(
        dataset_dir,
        train_split="train",
        eval_split="test",
        global_batch_size=BATCH,
        seed=seed,
        augment=augment,
        input_nice=input_nice,
    )


def batch_hash(batch):
    return hashlib.sha256(b"".join(part.numpy().tobytes() for part in batch)).hexdigest()


def hashes(dataset, count):
    return [batch_hash(batch) for batch in dataset.take(count)]


def test_a_stream_started_at_any_batch_equals_the_stream_from_its_start(dataset_dir):
    train = streams(dataset_dir).train
    from_start = hashes(train.batches_from(0), 60)
    for position in (1, 18, 19, 37, 41):  # in an epoch, and around epoch ends
        assert hashes(train.batches_from(position), 60 - position) == from_start[position:]
    assert len(set(from_start)) == 60


def test_each_epoch_is_a_new_permutation_of_every_example_and_augmentation_differs(dataset_dir):
    plain = streams(dataset_dir, augment="none").train.batches_from(0)
    images = np.concatenate([batch[0].numpy() for batch in plain.take(75)])  # 4 epochs
    epochs = images[: 4 * TRAIN_EXAMPLES].reshape(4, TRAIN_EXAMPLES, -1)
    reference = {row.tobytes(): index for index, row in enumerate(epochs[0])}
    assert len(reference) == TRAIN_EXAMPLES  # epoch 0 holds every example once
    orders = [[reference[row.tobytes()] for row in epoch] for epoch in epochs]
    for order in orders:
        assert sorted(order) == list(range(TRAIN_EXAMPLES))
    assert len({tuple(order) for order in orders}) == 4

    augmented = streams(dataset_dir).train.batches_from(0)
    first = next(iter(augmented))[0].numpy()
    assert not np.array_equal(first, images[:BATCH])  # cropped and flipped
    assert first.shape == (BATCH, 32, 32, 3) and first.dtype == np.uint8
    # Another seed draws other epochs.
    other = next(iter(streams(dataset_dir, augment="none", seed=8).train.batches_from(0)))
    assert not np.array_equal(other[0].numpy(), images[:BATCH])


class IndexedImages(tfds.core.GeneratorBasedBuilder):
    """Images, labels and one more feature: not the (encoded image, label) layout."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 3)),
                    "label": tfds.features.ClassLabel(num_classes=3),
                    "index": tf.int64,
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(40), "test": self._generate_examples(9)}

    def _generate_examples(self, count):
        rng = np.random.default_rng(count)
        for index in range(count):
            image = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            yield index, {"image": image, "label": index % 3, "index": index}


def stored_examples(dataset_dir, split):
    builder = tfds.builder_from_directory(dataset_dir)
    examples = builder.as_dataset(  # file after file: the order of the record indices
        split=split,
        as_supervised=True,
        shuffle_files=False,
        read_config=tfds.ReadConfig(interleave_cycle_length=1),
    )
    images, labels = zip(*((image.numpy(), label.numpy()) for image, label in examples))
    return np.stack(images), np.array(labels)


@pytest.fixture(scope="module")
def indexed_dir(tmp_path_factory):
    builder = IndexedImages(data_dir=str(tmp_path_factory.mktemp("indexed")))
    builder.download_and_prepare()
    return str(builder.data_dir)


@pytest.mark.parametrize("layout", ["encoded image and label", "other features"])
def test_a_batch_holds_the_stored_examples_at_the_shuffled_indices(
    layout, dataset_dir, indexed_dir
):
    directory = dataset_dir if layout == "encoded image and label" else indexed_dir
    images, labels = stored_examples(directory, "train")
    count = len(labels)
    stream = image_streams.from_tfds_directory(
        directory,
        train_split="train",
        eval_split="test",
        global_batch_size=BATCH,
        seed=5,
    )
    batch_images, batch_labels = next(iter(stream.train.batches_from(3)))
    positions = 3 * BATCH + np.arange(BATCH)
    indices = random_access.shuffled_index(
        tf.constant(positions % count), tf.constant(positions // count), num_examples=count, seed=5
    ).numpy()
    np.testing.assert_array_equal(batch_images.numpy(), images[indices])
    np.testing.assert_array_equal(batch_labels.numpy(), labels[indices])
    evaluation = list(stream.eval())
    np.testing.assert_array_equal(
        np.concatenate([batch[1].numpy() for batch in evaluation]),
        stored_examples(directory, "test")[1],
    )


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_seed_and_epoch_shuffles_well_even_zero(seed):
    """Keyed directly, RandomIndexShuffle's seed (0, 0) is close to the identity."""
    slots = tf.range(600, dtype=tf.int64)
    for epoch in (0, 1, 2):
        order = random_access.shuffled_index(
            slots, tf.fill([600], tf.constant(epoch, tf.int64)), num_examples=600, seed=seed
        ).numpy()
        assert sorted(order) == list(range(600))
        assert np.mean(order == np.arange(600)) < 0.02  # about 1 / 600 expected
        assert abs(np.corrcoef(np.arange(600), order)[0, 1]) < 0.15


def test_crop_flip_crops_the_reflect_padded_image_and_flips_half_keyed_per_example():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(64, 16, 8, 3), dtype=np.uint8)
    keys = tf.stack([tf.fill([64], tf.constant(3, tf.int64)), tf.range(64, dtype=tf.int64)], 1)
    out = image_streams.crop_flip(tf.constant(images), keys).numpy()
    padded = np.pad(images, [[0, 0], [2, 2], [1, 1], [0, 0]], mode="reflect")
    flips, shifts = 0, set()
    for image, result in zip(padded, out):
        found = [
            (top, left, flip)
            for top in range(5)
            for left in range(3)
            for flip in (False, True)
            if np.array_equal(
                result,
                (lambda crop: crop[:, ::-1] if flip else crop)(
                    image[top : top + 16, left : left + 8]
                ),
            )
        ]
        assert found, "not a crop of the padded image"
        flips += found[0][2]
        shifts.add(found[0][:2])
    assert 20 <= flips <= 44 and len(shifts) >= 10
    # The same keys give the same crops in another batch; other keys, others.
    again = image_streams.crop_flip(tf.constant(images[::-1]), tf.reverse(keys, [0])).numpy()
    np.testing.assert_array_equal(again[::-1], out)
    assert not np.array_equal(
        image_streams.crop_flip(tf.constant(images), keys + [0, 64]).numpy(), out
    )
    # A side of one pixel is left as it is.
    line = tf.constant(images[:, :1])
    assert image_streams.crop_flip(line, keys).shape == (64, 1, 8, 3)


def thread_niceness() -> dict[int, int]:
    """Each thread of this process (by id) and its niceness, as Linux reports it."""
    niceness = {}
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # it ended meanwhile
            continue
        niceness[int(thread)] = int(fields[16])  # stat's 19th field; these start at its 3rd
    return niceness


def test_lowered_input_threads_give_the_same_batches_and_only_they_are_lowered(dataset_dir):
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert own < 19, "run the tests at a niceness below 19: the input is lowered to 19"
    before = thread_niceness()
    lowered_stream = streams(dataset_dir, input_nice=19).train
    # Read as the framework reads a stream (its options too), at batch 5.
    iterator = iter(distributed_input.as_dataset_fn(lowered_stream, skip_batches=5)())

    @tf.function
    def read():  # as the train loop reads its stream: inside a tf.function
        return next(iterator)

    lowered_hashes = [batch_hash(read()) for _ in range(12)]
    after = thread_niceness()
    assert lowered_hashes == hashes(streams(dataset_dir).train.batches_from(5), 12)
    lowered = {thread for thread, nice in after.items() if nice == 19 and nice != own}
    # The input's own pool (a thread per usable core), no other thread.
    assert 1 <= len(lowered) <= len(os.sched_getaffinity(0)), after
    assert not lowered & set(before)
    assert after[threading.get_native_id()] == own
    assert all(after[thread] == nice for thread, nice in before.items() if thread in after)


@pytest.mark.parametrize("nice", [-1, 20, 2.0, True])
def test_a_niceness_the_input_cannot_run_at_is_refused_with_the_range(dataset_dir, nice):
    with pytest.raises(ValueError, match=rf"input_nice={nice!r} is not a niceness .* from 0 "):
        streams(dataset_dir, input_nice=nice)


def test_a_late_start_reads_only_the_batches_from_its_position(dataset_dir):
    """Starting at batch 100,000 (about 5,300 epochs in) reads as few records as at batch 0."""
    builder_files = sorted(
        os.path.join(dataset_dir, name)
        for name in os.listdir(dataset_dir)
        if "-train.tfrecord-" in name
    )
    reads = {}
    for position in (0, 100_000):
        records = random_access.RecordFiles(builder_files)
        stream = random_access.shuffled_batches(
            records,
            lambda serialized, key: tf.strings.length(serialized),
            global_batch_size=BATCH,
            seed=7,
        )
        iterator = iter(stream.batches_from(position))
        next(iterator)
        reads[position] = records.records_read
    assert records.num_examples == TRAIN_EXAMPLES
    # The first batch plus what prefetching read ahead, never the 3.2 million
    # records a skip would read first.
    assert BATCH <= reads[100_000] <= 16 * BATCH
    assert BATCH <= reads[0] <= 16 * BATCH


def test_tfrecord_and_array_record_files_give_the_same_batches(tmp_path, dataset_dir):
    array_record_dir = colored_digits.generate(
        str(tmp_path),
        train_examples=TRAIN_EXAMPLES,
        test_examples=100,
        num_shards=2,
        file_format="array_record",
    )
    assert any(".array_record-" in name for name in os.listdir(array_record_dir))
    assert hashes(streams(array_record_dir).train.batches_from(30), 5) == hashes(
        streams(dataset_dir).train.batches_from(30), 5
    )


def test_evaluation_reads_every_example_once_in_order(dataset_dir):
    batches = list(streams(dataset_dir).eval())
    assert [int(batch[1].shape[0]) for batch in batches] == [32, 32, 32, 4]
    labels = np.concatenate([batch[1].numpy() for batch in batches])
    plain = tf.data.Dataset.from_tensor_slices(labels)
    assert int(plain.cardinality()) == 100


# ---- The binary on the dataset: killed and preempted mid-epoch, on 1 and 2 workers. ----


def stream_flags(model_dir, dataset_dir, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={dataset_dir}",
        "--input_from=disk",
        "--augment=crop_flip",
        f"--global_batch_size={BATCH}",
        f"--train_steps={STEPS}",
        "--steps_per_loop=5",
        "--checkpoint_every=5",
        "--eval_every=0",
        "--export_dir=",
        *extra,
    ]


def logged_run(log_file, module, *flags):
    return Run([sys.executable, "-m", "stream_run", str(log_file), module, *flags])


def batch_log(log_file):
    """pid -> {position: hash} of each process that streamed batches."""
    runs = {}
    with open(log_file) as log:
        for line in log:
            pid, position, digest = line.split()
            runs.setdefault(int(pid), {})[int(position)] = digest
    return runs


ENV["PYTHONPATH"] = os.path.join(ROOT, "tests") + os.pathsep + ENV["PYTHONPATH"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, dataset_dir):
    """model_dir and batch log of a run straight through."""
    model_dir = tmp_path_factory.mktemp("uninterrupted")
    log_file = model_dir / "batches.log"
    logged_run(log_file, "loops.bin.classifier", *stream_flags(model_dir, dataset_dir)).succeed()
    (batches,) = batch_log(log_file).values()
    assert sorted(batches)[:STEPS] == list(range(STEPS))
    return str(model_dir), batches


def assert_resumed_exactly(log_file, uninterrupted_batches, resumed_at):
    """Each process's batches equal the uninterrupted run's; a restart begins at its step."""
    runs = list(batch_log(log_file).values())
    assert len(runs) == len(resumed_at)
    for batches, start in zip(runs, resumed_at):
        assert min(batches) == start  # nothing before the position was read
        # A run made every batch up to where the next run starts (or the end),
        # and prefetching a few more, more or fewer per run.
        end = min([later for later in resumed_at if later > start], default=STEPS)
        assert set(range(start, end)) <= set(batches)
        for position, digest in batches.items():
            assert digest == uninterrupted_batches.get(position, digest), position


def test_sigterm_and_kill_9_mid_epoch_resume_with_the_same_batches_and_weights(
    tmp_path, dataset_dir, uninterrupted
):
    reference_dir, reference_batches = uninterrupted
    log_file = tmp_path / "batches.log"
    command = ("loops.bin.classifier", *stream_flags(tmp_path, dataset_dir))

    run = logged_run(log_file, *command)
    run.wait_for(r"step 25/")  # in the second epoch
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() == exit_codes.PREEMPTED, run.output[-3000:]
    preempted_at = read_results(tmp_path)["global_step"]
    assert 25 <= preempted_at < STEPS and preempted_at % 5 == 0

    run = logged_run(log_file, *command)
    run.wait_for(rf"step {preempted_at + 10}/")
    run.process.kill()
    run.finish()
    killed_at = int(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).rsplit("-", 1)[1])
    assert preempted_at < killed_at < STEPS

    logged_run(log_file, *command).succeed()
    assert_resumed_exactly(log_file, reference_batches, [0, preempted_at, killed_at])
    assert read_results(tmp_path)["global_step"] == STEPS
    got, expected = checkpoint_weights(str(tmp_path)), checkpoint_weights(reference_dir)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_two_workers_preempted_mid_epoch_resume_with_one_machines_batches(
    tmp_path, dataset_dir, uninterrupted
):
    reference_dir, reference_batches = uninterrupted
    log_file = tmp_path / "batches.log"
    command = (
        "loops.cluster.launch",
        "--num_workers=2",
        "--grace_period=5",
        "--",
        "stream_run",
        str(log_file),
        "loops.bin.classifier",
        "--strategy=multi_worker_mirrored",
        "--num_replicas=1",
        *stream_flags(tmp_path, dataset_dir),
    )
    run = Run([sys.executable, "-m", *command])
    worker_1 = int(run.wait_for(r"\[launch\] worker_1 pid (\d+)").group(1))
    run.wait_for(r"\[worker_1\] step 25/")
    os.kill(worker_1, signal.SIGTERM)
    assert run.finish() == exit_codes.PREEMPTED, run.output[-4000:]
    preempted_at = read_results(tmp_path)["global_step"]
    assert 25 <= preempted_at < STEPS

    Run([sys.executable, "-m", *command]).succeed()
    assert_resumed_exactly(log_file, reference_batches, [0, 0, preempted_at, preempted_at])
    assert largest_weight_difference(str(tmp_path), reference_dir) <= RTOL


HALF = STEPS // 2 + 5  # in the second epoch


@pytest.fixture(scope="module")
def saved_by_two_workers(tmp_path_factory, dataset_dir):
    """The model_dir (with its batches.log) of HALF steps streamed by 2 workers x 1 replica:
    the same run for every topology it continues on, so each test continues a copy of it."""
    model_dir = tmp_path_factory.mktemp("two_workers")
    workers = (
        "loops.cluster.launch",
        "--num_workers=2",
        "--grace_period=5",
        "--",
        "stream_run",
        str(model_dir / "batches.log"),
        "loops.bin.classifier",
        "--strategy=multi_worker_mirrored",
        "--num_replicas=1",
        *stream_flags(model_dir, dataset_dir, f"--train_steps={HALF}"),
    )
    Run([sys.executable, "-m", *workers]).succeed()
    return str(model_dir)


@pytest.mark.parametrize("replicas", [4, 3])
def test_streamed_data_saved_by_two_workers_continues_on_one_process_with_the_same_batches(
    replicas, tmp_path, dataset_dir, uninterrupted, saved_by_two_workers
):
    """Another topology on restart: the stream goes on at the saved batch, the same batches."""
    reference_dir, reference_batches = uninterrupted
    model_dir = tmp_path / "run"
    shutil.copytree(saved_by_two_workers, model_dir)
    log_file = model_dir / "batches.log"
    one_process = logged_run(
        log_file,
        "loops.bin.classifier",
        "--strategy=mirrored",
        f"--num_replicas={replicas}",
        *stream_flags(model_dir, dataset_dir),
    ).succeed()
    assert "warning" not in one_process.output, one_process.output[-3000:]
    assert f"restored {model_dir}" in one_process.output  # the copy's own checkpoint
    assert_resumed_exactly(log_file, reference_batches, [0, 0, HALF])
    assert read_results(model_dir)["num_replicas"] == replicas
    assert largest_weight_difference(str(model_dir), reference_dir) <= RTOL


# ---- Image folders. ----


def write_folder(root, sizes=None, classes=("cat", "dog", "eel"), per_class=8):
    """An ImageFolder tree: per split, `per_class` noisy images of each class's color.

    Even-numbered images are PNGs, odd-numbered ones JPEGs.
    """
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("test", per_class // 2)):
        for label, name in enumerate(classes):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for index in range(count):
                height, width = (sizes or {}).get((split, name, index), (12, 16))
                pixels = rng.integers(0, 60, size=(height, width, 3))
                pixels[..., label % 3] += 160  # each class its own color
                image = tf.constant(pixels, tf.uint8)
                if index % 2:
                    file_name, encoded = f"{index:03d}.jpg", tf.io.encode_jpeg(image, quality=95)
                else:
                    file_name, encoded = f"{index:03d}.png", tf.io.encode_png(image)
                with open(os.path.join(folder, file_name), "wb") as handle:
                    handle.write(encoded.numpy())
    return str(root)


def folder_flags(model_dir, image_dir, steps, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--image_dir={image_dir}",
        "--global_batch_size=8",
        f"--train_steps={steps}",
        "--steps_per_loop=4",
        "--learning_rate=0.001",
        "--export_dir=",
        *extra,
    ]


def test_image_dir_trains_and_a_resumed_run_ends_with_the_same_weights(tmp_path):
    image_dir = write_folder(tmp_path / "images")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    done = run_module(
        "loops.bin.classifier", *folder_flags(straight, image_dir, 40, "--augment=crop_flip")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(straight)
    assert results["eval"]["accuracy"] >= 0.9  # red, green and blue noise
    assert results["eval"]["num_examples"] == 12
    for steps in (12, 40):
        done = run_module(
            "loops.bin.classifier", *folder_flags(resumed, image_dir, steps, "--augment=crop_flip")
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert "restored" in done.stdout
    got, expected = checkpoint_weights(str(resumed)), checkpoint_weights(str(straight))
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def folder_error(root, **options):
    with pytest.raises(image_folders.BadImageFolderError) as raised:
        image_streams.from_image_folder(
            str(root),
            train_split="train",
            eval_split="test",
            global_batch_size=8,
            seed=0,
            **options,
        )
    return str(raised.value)


def test_each_bad_folder_is_named_with_its_fix(tmp_path):
    assert "is not a folder" in folder_error(tmp_path / "missing")

    (tmp_path / "flat").mkdir()
    message = folder_error(tmp_path / "flat")
    assert "has no 'train' folder" in message and "CLASS" in message

    (tmp_path / "noclasses" / "train").mkdir(parents=True)
    assert "holds no class folders" in folder_error(tmp_path / "noclasses")

    mixed = write_folder(tmp_path / "mixed", sizes={("train", "dog", 3): (20, 16)})
    message = folder_error(mixed)
    bad = os.path.join(mixed, "train", "dog", "003.jpg")  # its size read from the JPEG header
    assert f"{bad} is 20x16" in message and "--image_size=" in message
    resized = image_streams.from_image_folder(
        mixed,
        train_split="train",
        eval_split="test",
        global_batch_size=8,
        seed=0,
        image_size=(12, 16),
    )
    assert resized.spec.input_shape == (12, 16, 3)
    assert resized.spec.class_names == ("cat", "dog", "eel")  # the confusion matrix names
    assert next(iter(resized.train()))[0].shape == (8, 12, 16, 3)

    broken = write_folder(tmp_path / "broken")
    bad = os.path.join(broken, "test", "eel", "001.png")
    with open(bad, "wb") as handle:
        handle.write(b"not an image at all")
    message = folder_error(broken)
    assert f"{bad} is not a PNG or JPEG image" in message and "remove it" in message
    assert "not an image at all" not in message  # never the file's bytes

    empty = write_folder(tmp_path / "empty")
    os.makedirs(os.path.join(empty, "train", "fox"))
    assert "holds no images" in folder_error(empty)

    extra = write_folder(tmp_path / "extra")
    os.makedirs(os.path.join(extra, "test", "yak"))
    assert "class folders the train split does not have: ['yak']" in folder_error(extra)


def test_the_binary_names_a_bad_folder_and_a_bad_size_before_any_work(tmp_path):
    (tmp_path / "flat").mkdir()
    done = run_module("loops.bin.classifier", *folder_flags(tmp_path / "m", tmp_path / "flat", 4))
    assert done.returncode != 0
    assert "has no 'train' folder" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists()
