"""Builds a tf.distribute strategy from a name and a replica count."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import tensorflow as tf

from loops import exit_codes
from loops.choices import STRATEGY_NAMES

CLUSTER_TIMEOUT_VARIABLE = "LOOPS_CLUSTER_TIMEOUT_SECONDS"
# Long enough for a scheduler to place and start every task of a real cluster.
DEFAULT_CLUSTER_TIMEOUT_SECONDS = 600.0
# The tasks a task cannot start without, by strategy: TensorFlow blocks in C++
# until they all answer (MultiWorkerMirroredStrategy's coordination service
# waits for every chief and worker; ParameterServerStrategy's chief connects
# to every worker and ps), and meanwhile SIGTERM goes to TensorFlow's own handler.
_AWAITED_TASK_TYPES = {
    "multi_worker_mirrored": ("chief", "worker"),
    "parameter_server": ("worker", "ps"),
}
_PROBE_INTERVAL_SECONDS = 0.25


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
    # Collective group keys start from a class-wide base, so a second
    # MirroredStrategy in one process (a notebook, a parity test) reuses the
    # first one's keys and its collectives abort ("joining a group with size 4,
    # but that group has size 2"). A fresh key range per strategy avoids it;
    # TensorFlow's own tests do the same.
    global _mirrored_count
    _mirrored_count += 1
    tf.distribute.MirroredStrategy._collective_key_base = _mirrored_count * 100_000
    return tf.distribute.MirroredStrategy(devices)


def cluster_resolver(name: str) -> tf.distribute.cluster_resolver.TFConfigClusterResolver:
    """The TF_CONFIG cluster for --strategy=`name`, checked for what that strategy needs.

    Every address is checked before any work (see `host_and_port`), so a typo
    fails here with its value instead of hanging or failing inside TensorFlow.

    Raises:
        ValueError: TF_CONFIG is not JSON, holds a bad address, gives this task
            an index its cluster lacks, or (parameter_server) lacks a ps, a
            worker or exactly one chief task.
    """
    raw = os.environ.get("TF_CONFIG", "")
    try:
        config = json.loads(raw) if raw else {}
    except json.JSONDecodeError as error:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({error}): {raw!r}. Set it to "
            '{"cluster": {...}, "task": {"type": ..., "index": ...}} or unset it.'
        ) from error
    cluster = config.get("cluster", {})
    if name == "parameter_server" and not (cluster.get("ps") and cluster.get("worker")):
        raise ValueError(
            "--strategy=parameter_server needs TF_CONFIG naming 'ps' and "
            f"'worker' tasks (and one 'chief'), got cluster={cluster!r}. Set TF_CONFIG "
            "on every task (see BUILD.md, 'Several machines'), or start the run with "
            "python -m loops.launch --num_workers=N --num_ps=M."
        )
    if name == "parameter_server" and len(cluster.get("chief", [])) != 1:
        raise ValueError(
            "--strategy=parameter_server needs exactly one 'chief' task in TF_CONFIG "
            "(the coordinator that runs the training loop), got "
            f"chief={cluster.get('chief', [])!r}. Pass --num_ps to loops-launch, which "
            "adds one, or add a chief task to TF_CONFIG on every task."
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    for task_type in spec.jobs:
        for index in spec.task_indices(task_type):
            host_and_port(f"{task_type}_{index}", spec.task_address(task_type, index))
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in spec.jobs and task_id not in spec.task_indices(task_type):
        raise ValueError(
            f"TF_CONFIG names this task {task_type}_{task_id}, but its cluster has "
            f"{spec.num_tasks(task_type)} {task_type} task(s) (indices "
            f"{sorted(spec.task_indices(task_type))}); give each task its own index "
            'among those in TF_CONFIG\'s "task".'
        )
    return resolver


def host_and_port(task: str, address: str) -> tuple[str, int]:
    """The host and port of `task`'s TF_CONFIG `address` (`host:port`, `[v6]:port`).

    Raises:
        ValueError: `address` is not host:port, its port is outside 1..65535,
            or its host does not resolve.
    """
    host, colon, port_text = str(address).rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not (colon and host and port_text.isdigit()):
        raise ValueError(
            f"TF_CONFIG gives {task} the address {address!r}, which is not host:port; "
            "write it like 10.0.0.2:2222 (the same cluster on every task)."
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(
            f"TF_CONFIG gives {task} port {port} (in {address!r}), outside 1..65535; "
            "pick a free port in that range (the same cluster on every task)."
        )
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(
            f"TF_CONFIG gives {task} the host {host!r} (in {address!r}), which does not "
            f"resolve ({error.strerror}); fix its spelling or give its IP address."
        ) from error
    return host, port


def cluster_timeout_seconds(cluster_timeout: float | None = None) -> float:
    """`cluster_timeout` if given, else $LOOPS_CLUSTER_TIMEOUT_SECONDS, else 600.

    Raises:
        ValueError: the value is not a number of seconds above 0.
    """
    where, seconds = f"cluster_timeout={cluster_timeout!r}", cluster_timeout
    if cluster_timeout is None:
        text = os.environ.get(CLUSTER_TIMEOUT_VARIABLE)
        if text is None:
            return DEFAULT_CLUSTER_TIMEOUT_SECONDS
        where = f"{CLUSTER_TIMEOUT_VARIABLE}={text!r}"
        with contextlib.suppress(ValueError):
            seconds = float(text)
    # `not >` also refuses NaN; infinity (wait for ever) is allowed.
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(
            f"{where} is not a number of seconds above 0; set it to how long a task may "
            f"wait for the others to start, e.g. {DEFAULT_CLUSTER_TIMEOUT_SECONDS:g}."
        )
    return float(seconds)


def wait_for_cluster(
    resolver: tf.distribute.cluster_resolver.ClusterResolver, name: str, timeout_seconds: float
) -> None:
    """Returns once every task --strategy=`name` needs accepts connections at its address.

    Without this TensorFlow blocks in C++ on a missing task, with no deadline
    and with SIGTERM taken by its own handler. Meanwhile this task listens on
    its own port, so peers waiting the same way see it up; it frees the port
    on return for TensorFlow's server. SIGTERM during the wait exits with
    exit_codes.PREEMPTED: nothing has run yet, so rerunning loses nothing.

    Raises:
        ValueError: a task did not come up within `timeout_seconds` (the
            message names each), or this task's own port is taken.
    """
    spec = resolver.cluster_spec()
    this_task = f"{resolver.task_type}_{resolver.task_id}"
    awaited = {
        f"{task_type}_{index}": spec.task_address(task_type, index)
        for task_type in _AWAITED_TASK_TYPES[name]
        if task_type in spec.jobs
        for index in spec.task_indices(task_type)
    }
    awaited.pop(this_task, None)
    if not awaited:
        return
    endpoints = {task: host_and_port(task, address) for task, address in awaited.items()}
    deadline = time.monotonic() + timeout_seconds
    with contextlib.ExitStack() as stack:
        own_port = None
        if resolver.task_type in spec.jobs:
            own_port = stack.enter_context(
                _listening(this_task, spec.task_address(resolver.task_type, resolver.task_id))
            )
        stack.enter_context(_exit_on_sigterm(this_task))
        missing = list(awaited)
        told = False
        while True:
            missing = [task for task in missing if not _accepts(*endpoints[task], deadline)]
            if not missing:
                return
            named = ", ".join(f"{task} at {awaited[task]}" for task in missing)
            if time.monotonic() >= deadline:
                them, they_need = ("it", "it needs") if len(missing) == 1 else ("them", "they need")
                raise ValueError(
                    f"{this_task} waited {timeout_seconds:g} s for its cluster, but {named} "
                    f"did not come up (nothing accepts connections there); start {them} "
                    f"with the same TF_CONFIG cluster, or set {CLUSTER_TIMEOUT_VARIABLE} "
                    f"(or make_strategy's cluster_timeout) higher if {they_need} longer."
                )
            if not told:
                print(
                    f"{this_task} waiting up to {timeout_seconds:g} s for {named}",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            if own_port is not None:
                _answer(own_port)
            time.sleep(_PROBE_INTERVAL_SECONDS)


@contextlib.contextmanager
def _listening(task: str, address: str) -> Iterator[socket.socket]:
    """A socket listening on `address`'s port on every interface, as TensorFlow's server will."""
    host, port = host_and_port(task, address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Connections of an earlier run in TIME_WAIT must not block the port.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise ValueError(
                f"Port {port} of {task} ({address} in TF_CONFIG) is taken by another "
                "process; stop it (an earlier run's task?) or give this task a free "
                "port in TF_CONFIG on every task."
            ) from error
        listener.listen(16)
        listener.setblocking(False)
        yield listener
    finally:
        listener.close()


def _answer(listener: socket.socket) -> None:
    """Accepts and closes the peers' probes, so they never fill the listen queue."""
    while True:
        try:
            connection, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        connection.close()


def _accepts(host: str, port: int, deadline: float) -> bool:
    """Whether something accepts a TCP connection at `host`:`port`."""
    # A host that drops packets must not hold the wait past its deadline.
    timeout = min(1.0, max(0.05, deadline - time.monotonic()))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _exit_on_sigterm(task: str) -> Iterator[None]:
    """SIGTERM exits with exit_codes.PREEMPTED and a sentence (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_preempted(signum, frame):
        del signum, frame
        print(
            f"{task} received SIGTERM while waiting for its cluster, before any work; "
            f"exiting with code {exit_codes.PREEMPTED} (preempted): rerun the same command "
            "to start again.",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(exit_codes.PREEMPTED)

    previous = signal.signal(signal.SIGTERM, exit_preempted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
            `parameter_server` wait for the other tasks of TF_CONFIG to come up
            (see `wait_for_cluster`); None reads $LOOPS_CLUSTER_TIMEOUT_SECONDS,
            else 600.

    Raises:
        ValueError: an unknown name, an impossible replica count, a bad
            TF_CONFIG or cluster_timeout, or a task that did not come up in time.
    """
    if name not in STRATEGY_NAMES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGY_NAMES)}.")
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a whole number >= 1, got {num_replicas!r}.")
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
    if name in _AWAITED_TASK_TYPES:
        timeout_seconds = cluster_timeout_seconds(cluster_timeout)
        resolver = cluster_resolver(name)
        wait_for_cluster(resolver, name, timeout_seconds)
        if name == "multi_worker_mirrored":
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
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


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Worker (and chief) tasks in the strategy's cluster; 1 outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return max(1, len(cluster.get("worker", [])) + len(cluster.get("chief", [])))


def task_name(strategy: tf.distribute.Strategy) -> str:
    """`worker_1`-style name of this task; `local` outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return "local"
    return f"{resolver.task_type}_{resolver.task_id}"


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
    "_DefaultDistributionStrategy": "default",
}


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN CPU kernels.

    TF_ENABLE_ONEDNN_OPTS decides; unset, TensorFlow turns them on only on CPUs
    with AVX-512 VNNI or BF16, AVX-VNNI or AMX, so only TensorFlow can answer.
    """
    from tensorflow.python.util import _pywrap_util_port  # TensorFlow's own answer, read at import

    return bool(_pywrap_util_port.IsMklEnabled())


def strategy_name(strategy: tf.distribute.Strategy) -> str:
    """The --strategy name of a strategy object (its class name if unknown)."""
    class_name = type(strategy).__name__
    return _NAMES_BY_CLASS.get(class_name, class_name)
