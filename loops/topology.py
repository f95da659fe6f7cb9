"""Where a step runs, read from a strategy: its name, this task's place, each replica's rows.

The ground floor under the input, the core, the model_dir and the run: small
functions of a strategy object (or of a row count) that every layer asks. They
never build a strategy or look for a cluster; that is `loops.cluster`, a side
wing that only the command line, the binaries, `loops.testing` and the run's
cluster-specific parts import. The parts do not branch on a strategy's name: they
ask a `loops.placement.Placement`, which reads it here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from loops import tf_private

_NAMES_BY_CLASS = {
    "MirroredStrategy": "mirrored",
    "CentralStorageStrategy": "central_storage",
    "OneDeviceStrategy": "one_device",
    "MultiWorkerMirroredStrategy": "multi_worker_mirrored",
    "CollectiveAllReduceStrategy": "multi_worker_mirrored",
    "ParameterServerStrategy": "parameter_server",
    "ParameterServerStrategyV2": "parameter_server",
    "TPUStrategy": "tpu",
    "TPUStrategyV2": "tpu",
    tf_private.DEFAULT_STRATEGY_CLASS: "default",
}


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The --strategy name of a strategy object (its class name if unknown)."""
    class_name = type(strategy).__name__
    return _NAMES_BY_CLASS.get(class_name, class_name)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True on the one task that writes summaries, results and the checkpoint."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and not has_chief


def parameter_server_workers(strategy: tf.distribute.Strategy) -> int:
    """The `worker` tasks of a ParameterServerStrategy's cluster (its chief not counted)."""
    return tf_private.parameter_server_workers(strategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Worker (and chief) tasks in the strategy's cluster; 1 outside a cluster."""
    if strategy_name(strategy) == "parameter_server":
        # Made only on the chief (the coordinator), which counts itself.
        return parameter_server_workers(strategy) + 1
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", [])))


def worker_index(strategy: tf.distribute.Strategy) -> int:
    """This task's place among the synchronous workers of the strategy's cluster, the chief
    first (as MultiWorkerMirroredStrategy numbers its replicas: worker k's come after those
    of the tasks before it); 0 outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0
    cluster = resolver.cluster_spec().as_dict()
    if resolver.task_type == "chief":
        return 0
    return int(resolver.task_id) + (1 if "chief" in cluster else 0)


def task_name(strategy: tf.distribute.Strategy) -> str:
    """`worker_1`-style name of this task; `local` outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return "local"
    return f"{resolver.task_type}_{resolver.task_id}"


def replica_bounds(rows, replica_id, num_replicas: int):
    """First and one-past-last row of replica `replica_id`'s slice of a global batch of `rows`.

    Contiguous, balanced slices in replica order: each replica holds
    floor(rows / num_replicas) rows and the first `rows % num_replicas` one
    more, so a replica is empty only when the batch has fewer rows than there
    are replicas. `replica_id` may be a vector of ids. Every split of the
    framework (tf.data pipelines, the step's slices, per-row random draws)
    follows this one rule.
    """
    base, extra = rows // num_replicas, rows % num_replicas
    start = replica_id * base + tf.minimum(replica_id, extra)
    return start, start + base + tf.cast(replica_id < extra, base.dtype)


@contextlib.contextmanager
def variable_scope(strategy: tf.distribute.Strategy) -> Iterator[None]:
    """`strategy.scope()`, adjusted so state a replica writes works under every strategy.

    CentralStorageStrategy holds one copy of each variable and refuses an
    assignment in replica context unless the variable has an aggregation;
    Keras 3 creates batch-norm moving statistics with none and assigns them
    there. In this scope such variables (not trainable, aggregation NONE) get
    ONLY_FIRST_REPLICA: synchronized statistics are equal on every replica, and
    a mirrored strategy saves replica 0's copy too. Trainable variables change
    only through the optimizer, in cross-replica context, and keep theirs.
    """
    with strategy.scope():
        if strategy_name(strategy) != "central_storage":
            yield
            return

        def first_replica_writes(next_creator, **kwargs):
            # trainable=None (tf.Variable's default) means trainable.
            if kwargs.get("trainable") is False and kwargs.get("aggregation") in (
                None,
                tf.VariableAggregation.NONE,
            ):
                kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
            return next_creator(**kwargs)

        with tf.variable_creator_scope(first_replica_writes):
            yield


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN CPU kernels.

    TF_ENABLE_ONEDNN_OPTS decides; unset, TensorFlow turns them on only on CPUs
    with AVX-512 VNNI or BF16, AVX-VNNI or AMX, so only TensorFlow can answer.
    """
    return tf_private.onednn_enabled()
