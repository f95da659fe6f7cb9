"""Runs a Loop's train steps asynchronously on parameter-server workers through a ClusterCoordinator.

Under `tf.distribute.ParameterServerStrategy` the variables live on the `ps`
tasks, the `worker` tasks only run functions the coordinator (the `chief`
task, which runs the Loop) schedules on them, and no two workers ever wait for
each other. Training is therefore asynchronous: each worker reads its own
stream of global batches, computes a step on whatever weights it reads from the
parameter servers, and applies its update there; the order of updates is not
reproducible. Exact resume mid-stream and replica parity, which the synchronous
strategies give, do not apply here.

Every process of such a cluster runs the same binary: `serve_unless_chief`
turns a `worker` or `ps` process into a `tf.distribute.Server` that serves
until it is killed, and lets the `chief` go on to build and train the Loop.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import tensorflow as tf

from loops import distributed_input, strategies

SERVER_TASKS = ("worker", "ps")


class StepScheduler:
    """Schedules a Loop's `train_step` on the workers, `steps` at a time.

    Each scheduled call runs one `train_step` on one worker and then adds 1 to
    the global step on the parameter servers (an atomic assign_add), so the
    global step counts the steps that completed. `run_steps` waits for all of
    them (`ClusterCoordinator.join`) and returns their logs in the order they
    were scheduled, so the Loop's progress, summaries and log aggregation work
    as for the synchronous inner loop. A step whose `nonfinite` flag is set
    does not stop the others already scheduled in the same inner loop.

    Args:
        strategy: a ParameterServerStrategy whose process is the chief.
        check_outputs: called with the step's output specs (name -> TensorSpec)
            once, after the first steps; raises for outputs a Loop cannot use.
    """

    def __init__(self, strategy: tf.distribute.Strategy, *,
                 check_outputs: Callable[[Mapping[str, tf.TensorSpec]], None]):
        self.strategy = strategy
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self._check_outputs = check_outputs
        self._step_function = None

    def iterator(self, source: distributed_input.DatasetSource):
        """A per-worker iterator over `worker_stream(source)`, to pass to `run_steps`."""
        strategy = self.strategy

        def per_worker_dataset():
            return strategy.distribute_datasets_from_function(
                lambda context: distributed_input.split_global_batches(
                    worker_stream(source), context))

        return iter(self.coordinator.create_per_worker_dataset(per_worker_dataset))

    def run_steps(self, train_step: Callable, global_step: tf.Variable, iterator,
                  steps: int) -> dict[str, np.ndarray]:
        """Runs `train_step` `steps` times on the workers; returns name -> per-step values."""
        if self._step_function is None:
            def counted_step(worker_iterator):
                logs = train_step(worker_iterator)
                global_step.assign_add(1)
                return logs

            self._step_function = tf.function(counted_step)
        remote_logs = [self.coordinator.schedule(self._step_function, args=(iterator,))
                       for _ in range(steps)]
        self.coordinator.join()
        per_step = [self.coordinator.fetch(logs) for logs in remote_logs]
        first = per_step[0]
        if self._check_outputs is not None:
            self._check_outputs(
                {name: tf.TensorSpec(np.shape(value), tf.as_dtype(np.asarray(value).dtype))
                 for name, value in first.items()} if isinstance(first, Mapping) else first)
            self._check_outputs = None  # the step's outputs keep their structure
        return {name: np.array([logs[name] for logs in per_step]) for name in first}


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
    """On a `worker` or `ps` task of TF_CONFIG, serves the cluster until killed; on the chief, returns.

    Raises:
        ValueError: TF_CONFIG names no chief, or this task is neither chief,
            worker nor ps.
    """
    resolver = strategies.cluster_resolver("parameter_server")
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return
    if task_type not in SERVER_TASKS:
        raise ValueError(
            f"--strategy=parameter_server runs tasks of type chief, worker or ps; TF_CONFIG "
            f"names this task {task_type!r}. Give it one of those types.")
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task_type, task_index=task_id,
        protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"{task_type}_{task_id} serving at {server.target} until stopped", flush=True)
    server.join()

