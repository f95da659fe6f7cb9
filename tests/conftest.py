"""Test setup: 4 logical CPUs (before any TensorFlow op) and small shared datasets."""

import json
import os
import re
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import loops  # noqa: E402

loops.configure_logical_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """A TFDS data_dir holding the prepared bundled digits."""
    import loops_data as data

    directory = str(tmp_path_factory.mktemp("tfds"))
    data.load_builder("digits", directory)
    return directory


def tiny_examples(count=21, seed=0):
    """`count` random 8x8x1 uint8 images with labels 0-9."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(count,), dtype=np.int64)
    return images, labels


def tiny_batches(global_batch_size=8, count=21, seed=0, shuffle_seed=None):
    """A function building one epoch of global batches of `tiny_examples`."""
    images, labels = tiny_examples(count, seed)

    def make():
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        if shuffle_seed is not None:
            dataset = dataset.shuffle(count, seed=shuffle_seed, reshuffle_each_iteration=True)
        return dataset.batch(global_batch_size)

    return make


def failing_at_batch(failing, global_batch_size=8):
    """`tiny_batches`, endless; batch `failing` raises OSError in its Python reader (as a
    file that no longer reads would)."""
    batches = tiny_batches(global_batch_size)

    def read(index):
        if index == failing:
            raise OSError(f"batch {index} no longer reads")
        return index

    def checked(index, batch):
        read_index = tf.numpy_function(read, [index], tf.int64, stateful=True)
        with tf.control_dependencies([read_index]):
            return tf.identity(batch[0]), batch[1]

    return lambda: batches().repeat().enumerate().map(checked)


def optimizer_factory(name, learning_rate=0.05):
    if name == "sgd_momentum":
        return lambda: keras.optimizers.SGD(learning_rate, momentum=0.9)
    if name == "adam":
        return lambda: keras.optimizers.Adam(learning_rate * 0.1)
    if name == "adam_eps3":
        # Batch norm makes the loss invariant to the scale of the kernel before
        # it, so some gradient entries are zero in exact arithmetic and pure
        # rounding noise (1e-9) in float32. Adam turns noise into an update of
        # about lr * g / (|g| + epsilon): with epsilon 1e-7 that update differs
        # between any two summation orders, replicas or not. 1e-3 keeps it tiny.
        return lambda: keras.optimizers.Adam(learning_rate * 0.1, epsilon=1e-3)
    raise ValueError(name)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPROCESS_ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_module(module, *argv, timeout=900):
    """Runs `python -m module argv...` from the repository root; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=timeout,
        cwd=ROOT,
    )


def read_results(model_dir):
    """The results.json a run wrote into model_dir."""
    with open(os.path.join(model_dir, "results.json")) as stream:
        return json.load(stream)


# TensorFlow's count of the saves a tf.train.Checkpoint made in its process: a resumed run
# counts from the restored value plus its own saves (6 against 3 uninterrupted), while
# every tensor the run trains and steps on is equal. The one key comparisons leave out.
SAVE_COUNTER_KEY = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"


def checkpoint_weights(model_dir):
    """Every numeric variable value in the newest checkpoint of a run's model_dir, by
    checkpoint key, but TensorFlow's `SAVE_COUNTER_KEY` (and the string records: recoveries,
    the exact-only settings, JSON)."""
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
    dtypes = reader.get_variable_to_dtype_map()
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if "/.ATTRIBUTES/VARIABLE_VALUE" in name
        and name != SAVE_COUNTER_KEY
        and dtypes[name] != tf.string
    }


def make_trainer(definition_class, /, *args, **arguments):
    """`loops.Trainer(definition_class(*args, ...), ...)`, the keyword arguments split between
    the definition and the Trainer by the Trainer's signature (for tests' factories that
    take both)."""
    import inspect

    settings = set(inspect.signature(loops.Trainer).parameters) - {"definition"}
    run = {name: value for name, value in arguments.items() if name in settings}
    own = {name: value for name, value in arguments.items() if name not in settings}
    return loops.Trainer(definition_class(*args, **own), **run)


class OutputRun:
    """A subprocess whose merged output lines are collected by a thread as they come."""

    def __init__(self, command, env):
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        """Returns the match of the first output line matching `pattern`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    match = re.search(pattern, line)
                    if match:
                        return match
                assert self._reader.is_alive(), (
                    f"the run ended (exit code {self.process.poll()}) with no line matching "
                    f"{pattern!r}:\n{self.output[-3000:]}"
                )
                left = deadline - time.monotonic()
                assert left > 0, (
                    f"no line matching {pattern!r} in {timeout} s:\n{self.output[-3000:]}"
                )
                self._changed.wait(min(left, 1.0))

    def finish(self, timeout=180):
        """Waits for the end; returns the exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(timeout=10)
        return code

    def succeed(self, timeout=180):
        code = self.finish(timeout)
        assert code == 0, f"exit code {code}:\n{self.output[-4000:]}"
        return self
