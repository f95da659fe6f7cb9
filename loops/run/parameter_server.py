"""Parameter-server training: the workers' input streams and the tasks that serve the chief.

Under `tf.distribute.ParameterServerStrategy` the variables live on the `ps`
tasks, the `worker` tasks only run functions the coordinator (the `chief`
task, which runs the Trainer) schedules on them, and no two workers ever wait for
each other. Training is therefore asynchronous: each worker reads its own
stream of global batches, computes a step on whatever weights it reads from the
parameter servers, and applies its update there; the order of updates is not
reproducible. Exact resume mid-stream and replica parity, which the synchronous
strategies give, do not apply here.

Every process of such a cluster runs the same binary: `serve_unless_chief`
turns a `worker` or `ps` process into a `tf.distribute.Server` that serves
until it is killed, and lets the `chief` go on to build and train the Trainer.
"""

from __future__ import annotations

import signal

import tensorflow as tf

from loops.cluster import strategies
from loops.input import distributed_input


def worker_iterator(
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
    source: distributed_input.DatasetSource,
):
    """A per-worker iterator over `worker_stream(source)`, for steps scheduled on the workers."""
    strategy = coordinator.strategy

    def per_worker_dataset():
        return strategy.distribute_datasets_from_function(
            lambda context: distributed_input.split_global_batches(worker_stream(source), context)
        )

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset))


def worker_stream(source: distributed_input.DatasetSource) -> tf.data.Dataset:
    """The endless stream of global batches one worker trains on.

    Every worker builds the same stream, so each starts it at its own random
    batch of the first epoch: at any time the workers train on different
    batches, and over the run each sees every example equally often. The draw
    has no seed, so it differs per worker (unless a global seed is set with
    tf.random.set_seed); a stream of unknown length starts at its beginning.
    """
    epoch = distributed_input.as_dataset_fn(source)()
    length = tf.maximum(epoch.cardinality(), 1)
    start = tf.random.uniform([], maxval=length, dtype=tf.int64)
    return epoch.repeat().skip(start)


def serve_unless_chief() -> None:
    """On a `worker` or `ps` task of TF_CONFIG, serves the cluster until killed; the chief returns.

    Raises:
        ValueError: TF_CONFIG is bad for it (`strategies.cluster_resolver`).
    """
    resolver = strategies.cluster_resolver("parameter_server")
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task_type,
        task_index=task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{task_type}_{task_id} serving at {server.target} until stopped", flush=True)
    # join blocks in C++ holding the GIL, so a Python SIGTERM handler (a binary
    # installs one at its start) would never run: the default action ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server.join()
