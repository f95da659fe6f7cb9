"""Waits, with a deadline, for the TF_CONFIG tasks a multi-worker strategy cannot start without."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator

import tensorflow as tf

from loops.vocabulary import exit_codes

CLUSTER_TIMEOUT_VARIABLE = "LOOPS_CLUSTER_TIMEOUT_SECONDS"
# Long enough for a scheduler to place and start every task of a real cluster.
DEFAULT_CLUSTER_TIMEOUT_SECONDS = 600.0
# The tasks a task cannot start without, by strategy: TensorFlow blocks in C++
# until they all answer (MultiWorkerMirroredStrategy's coordination service
# waits for every chief and worker; ParameterServerStrategy's chief connects
# to every worker and ps), and meanwhile SIGTERM goes to TensorFlow's own handler.
AWAITED_TASK_TYPES = {
    "multi_worker_mirrored": ("chief", "worker"),
    "parameter_server": ("worker", "ps"),
}
_PROBE_INTERVAL_SECONDS = 0.25


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
        for task_type in AWAITED_TASK_TYPES[name]
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
