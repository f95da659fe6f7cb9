"""Builds a tf.distribute strategy from a name and a replica count."""

from __future__ import annotations

import sys

import tensorflow as tf

from loops import placement, tf_private
from loops.cluster import cluster_config, task_cluster
from loops.cluster.cluster_config import host_and_port  # noqa: F401  (re-exported)
from loops.cluster.cluster_wait import (  # noqa: F401  (re-exported: loops.cluster.strategies.X keeps working)
    AWAITED_TASK_TYPES,
    CLUSTER_TIMEOUT_VARIABLE,
    DEFAULT_CLUSTER_TIMEOUT_SECONDS,
    cluster_timeout_seconds,
    wait_for_cluster,
)
from loops.cluster.startup_watchdog import StartupWatchdog
from loops.vocabulary import exit_codes
from loops.vocabulary.choices import STRATEGY_NAMES
from loops.vocabulary.whole_numbers import check_whole


def configure_logical_cpus(count: int) -> list[tf.config.LogicalDevice]:
    """Splits the host CPU into `count` logical devices and returns them.

    Must run before TensorFlow initializes its runtime (before any op runs).
    If the CPU is already split into at least `count` devices, nothing changes.

    Raises:
        ValueError: `count` is below 1.
        RuntimeError: the runtime is already initialized with fewer devices.
    """
    if count < 1:
        raise ValueError(f"Logical CPU count must be >= 1, got {count}.")
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing is not None and len(existing) >= count:
        return tf.config.list_logical_devices("CPU")[:count]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError as error:
        have = len(tf.config.list_logical_devices("CPU"))
        raise RuntimeError(
            f"Cannot split the CPU into {count} logical devices: TensorFlow "
            f"already started with {have}. Call "
            f"loops.configure_logical_cpus({count}) (or make_strategy) before "
            "any TensorFlow op runs."
        ) from error
    return tf.config.list_logical_devices("CPU")[:count]


def _local_devices(num_replicas: int) -> list[str]:
    """`num_replicas` GPUs when present, else as many logical CPUs."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        return [f"/gpu:{i}" for i in range(num_replicas)]
    if gpus:
        raise ValueError(
            f"--num_replicas={num_replicas} asks for more replicas than the "
            f"{len(gpus)} GPUs present; pass --num_replicas<={len(gpus)}."
        )
    return [d.name for d in configure_logical_cpus(num_replicas)]


_mirrored_count = 0


def _mirrored(devices: list[str]) -> tf.distribute.Strategy:
    # A key range of its own: a second MirroredStrategy in one process would otherwise
    # reuse the first one's collective keys (`tf_private.start_collective_keys_at`).
    global _mirrored_count
    _mirrored_count += 1
    tf_private.start_collective_keys_at(_mirrored_count * 100_000)
    return tf.distribute.MirroredStrategy(devices)


def cluster_resolver(name: str) -> tf.distribute.cluster_resolver.TFConfigClusterResolver:
    """The cluster for --strategy=`name`, checked for what that strategy needs.

    The cluster is TF_CONFIG's, else SLURM's or a Kubernetes Indexed Job's,
    adopted as TF_CONFIG (`task_cluster.adopt_cluster`) unless the
    command line adopted one already.

    TF_CONFIG is checked before any work (see `cluster_config.check_cluster`),
    so a typo fails here with its value instead of hanging or failing inside
    TensorFlow.

    Raises:
        ValueError: no cluster, TF_CONFIG is not JSON, holds a bad address,
            names a task its cluster lacks, gives this task a port another
            process holds, or (parameter_server) lacks a ps, a worker or
            exactly one chief task.
    """
    found = task_cluster.adopt_cluster(name)
    if found is not None:
        print(found.line(), file=sys.stderr, flush=True)
    cluster_config.check_cluster(name)
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def _start_cluster_strategy(name: str, timeout_seconds: float) -> tf.distribute.Strategy:
    """The multi-process strategy `name`, its start-up bounded end to end (see `startup_watchdog`).

    The task waits up to `timeout_seconds` for its peers, then gives
    TensorFlow's own start as long again; SIGTERM meanwhile exits 42.
    """
    resolver = cluster_resolver(name)
    task = f"{resolver.task_type}_{resolver.task_id}"
    with StartupWatchdog(task, timeout_seconds, timeout_seconds, exit_codes.PREEMPTED) as watchdog:
        wait_for_cluster(resolver, name, timeout_seconds)
        watchdog.tensorflow_starts()
        if name == "multi_worker_mirrored":
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        # Only embedding tables are split by rows over the servers (`placement.TablePartitioner`).
        servers = len(resolver.cluster_spec().as_dict().get("ps", []))
        return tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=placement.TablePartitioner(servers)
        )


def make_strategy(
    name: str = "default", num_replicas: int = 1, *, cluster_timeout: float | None = None
) -> tf.distribute.Strategy:
    """Returns the strategy called `name` with `num_replicas` local replicas.

    Args:
        name: one of STRATEGY_NAMES.
        num_replicas: replicas on this host. With `mirrored` and
            `central_storage` these are GPUs when enough are present, else
            logical devices split from the CPU (which must happen before any
            TensorFlow op runs). Other strategies take their devices from the
            hardware and accept only 1 here.
        cluster_timeout: seconds `multi_worker_mirrored` and the chief of
            `parameter_server` wait for the other TF_CONFIG tasks to come up (see
            `cluster_wait.wait_for_cluster`), and then give TensorFlow's own
            start; None: $LOOPS_CLUSTER_TIMEOUT_SECONDS, else 600.

    Raises:
        ValueError: an unknown name, an impossible replica count, a bad
            TF_CONFIG or cluster_timeout, or a task that did not come up in time.

    A cluster strategy whose TensorFlow start outlasts its bound ends the
    process with a sentence and exit code 1, and SIGTERM during its start-up
    with exit_codes.PREEMPTED (`startup_watchdog`).
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}.")
    check_whole("num_replicas", num_replicas)
    if name == "mirrored":
        return _mirrored(_local_devices(num_replicas))
    if name == "central_storage":
        # Variables live on one device (the CPU when there are several replicas),
        # each replica computes on its own device and the gradients are summed there.
        return tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=_local_devices(num_replicas)
        )
    if num_replicas != 1:
        raise ValueError(
            f"num_replicas={num_replicas} applies only to --strategy=mirrored or "
            f"central_storage; --strategy={name} takes its devices from the machine. "
            "Pass --num_replicas=1 or use --strategy=mirrored."
        )
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if name in AWAITED_TASK_TYPES:
        return _start_cluster_strategy(name, cluster_timeout_seconds(cluster_timeout))
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise ValueError(
            f"--strategy=tpu found no reachable TPU ({error}). Run on a TPU VM "
            "or pick --strategy=mirrored."
        ) from error
    return tf.distribute.TPUStrategy(resolver)
