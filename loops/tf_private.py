"""The places where loops reaches into tf.distribute or tf.data through a private name, each in
one function, because TensorFlow leaves no public way; `tests/test_tf_private.py` fails when a
TensorFlow release renames what they rely on. It imports nothing of the framework: it stands
beside `loops.topology`, under the cluster wing and the input, which both use it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

# What each adapter relies on, checked by the test.
# A class attribute of MirroredStrategy: where its collective group and instance keys start.
COLLECTIVE_KEY_BASE = "_collective_key_base"
# A MirroredStrategy's `extended`: the (host, compute devices) its input pipelines run for.
INPUT_WORKER_DEVICES = "_input_workers_devices"
# A tf.data iterator's resource tensor, which `tf.raw_ops.IteratorGetNextSync` reads.
ITERATOR_RESOURCE = "_iterator_resource"


def start_collective_keys_at(base: int) -> None:
    """Makes the MirroredStrategy made next key its collectives from `base` on.

    Its keys start from a class-wide base (0), so a second MirroredStrategy in
    one process (a notebook, a parity test) reuses the first one's keys and
    its collectives abort ("joining a group with size 4, but that group has
    size 2"). A strategy copies the base when it is made; TensorFlow's own
    tests give each a range of its own the same way.
    """
    setattr(tf.distribute.MirroredStrategy, COLLECTIVE_KEY_BASE, base)


@contextlib.contextmanager
def input_workers_kept(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Inside, `strategy` may change its input-worker devices; after, they are as before.

    TF 2.21's MirroredStrategy overwrites them for good when asked for
    per-replica pipelines (`distribute_datasets_from_function` with
    `experimental_replication_mode` PER_REPLICA), and every later
    `experimental_distribute_dataset` on it then fails ("Could not apply FILE
    based sharding"). A strategy without them is left as it is.
    """
    extended = strategy.extended
    saved = getattr(extended, INPUT_WORKER_DEVICES, None)
    try:
        yield
    finally:
        if saved is not None:
            setattr(extended, INPUT_WORKER_DEVICES, saved)


def iterator_resource(iterator: Any) -> tf.Tensor | None:
    """The resource tensor of a plain tf.data iterator, which `tf.raw_ops.IteratorGetNextSync`
    reads (without the asynchronous kernel of `next`); None for another iterator (a
    distributed one)."""
    if not isinstance(iterator, tf.data.Iterator):
        return None
    return getattr(iterator, ITERATOR_RESOURCE, None)
