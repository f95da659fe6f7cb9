"""Waits, with a deadline, for the TF_CONFIG tasks a multi-worker strategy cannot start without."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from loops.cluster.cluster_config import bind_own_port, host_and_port

if TYPE_CHECKING:
    import tensorflow as tf

CLUSTER_TIMEOUT_VARIABLE = "LOOPS_CLUSTER_TIMEOUT_SECONDS"
# Long enough for a scheduler to place and start every task of a real cluster.
DEFAULT_CLUSTER_TIMEOUT_SECONDS = 600.0
# The tasks a task cannot start without, by strategy: TensorFlow blocks in C++
# until they all answer (MultiWorkerMirroredStrategy's coordination service
# waits for every chief and worker; ParameterServerStrategy's chief connects
# to every worker and ps), and meanwhile the main thread holds the GIL, so no
# Python signal handler or thread runs (see `startup_watchdog`).
AWAITED_TASK_TYPES = {
    "multi_worker_mirrored": ("chief", "worker"),
    "parameter_server": ("worker", "ps"),
}
_PROBE_INTERVAL_SECONDS = 0.25
# A task's port that keeps answering without speaking HTTP/2 for this long is
# some other program's: the task itself could not listen there.
FOREIGN_GRACE_SECONDS = 5.0
# What a gRPC client sends first (RFC 9113, 3.4): the connection preface and an
# empty SETTINGS frame (length 0, type 4, no flags, stream 0). A gRPC server,
# TensorFlow's included, answers with a SETTINGS frame of its own; a waiting
# task answers the same way.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_FRAME_HEADER_BYTES = 9
_SETTINGS_FRAME_TYPE = 4
# The answers a task's address gives a probe.
DOWN, FOREIGN, UP = "nothing accepts connections there", "a foreign program", "up"


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
    """Returns once every task --strategy=`name` needs answers at its address as a gRPC server.

    Without this TensorFlow blocks in C++ on a missing task, with no deadline.
    Meanwhile this task listens on its own port and answers as TensorFlow's
    server would, so peers waiting the same way see it up; it frees the port
    on return for TensorFlow's server. A port that accepts connections but
    does not answer as a gRPC server is another program's, and is named.

    Raises:
        ValueError: a task did not come up within `timeout_seconds` (the
            message names each), a task's address answers as a foreign
            program, or this task's own port is taken.
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
    own_address = None
    if resolver.task_type in spec.jobs:
        own_address = spec.task_address(resolver.task_type, resolver.task_id)
    with _WaitingListener(this_task, own_address):
        _probe_until_up(this_task, awaited, timeout_seconds)


def _probe_until_up(
    this_task: str,
    awaited: Mapping[str, str],
    timeout_seconds: float,
) -> None:
    # A host that does not resolve yet (a Kubernetes pod not yet running) is
    # down until it does; TF_CONFIG's own hosts were resolved by its check.
    endpoints = {
        task: host_and_port(task, address, resolve=False) for task, address in awaited.items()
    }
    deadline = time.monotonic() + timeout_seconds
    foreign_since: dict[str, float] = {}
    missing = list(awaited)
    told = False
    while True:
        answers = {task: probe(*endpoints[task], deadline) for task in missing}
        now = time.monotonic()
        for task, answer in answers.items():
            if answer != FOREIGN:
                foreign_since.pop(task, None)
            else:
                foreign_since.setdefault(task, now)
        missing = [task for task in missing if answers[task] != UP]
        if not missing:
            return
        foreign = [
            task for task, since in foreign_since.items() if now - since >= FOREIGN_GRACE_SECONDS
        ]
        if foreign or (foreign_since and now >= deadline):
            raise ValueError(_foreign_message(this_task, foreign or list(foreign_since), endpoints))
        named = ", ".join(f"{task} at {awaited[task]}" for task in missing)
        if now >= deadline:
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
        time.sleep(_PROBE_INTERVAL_SECONDS)


def _foreign_message(
    this_task: str, foreign: list[str], endpoints: Mapping[str, tuple[str, int]]
) -> str:
    task = foreign[0]
    host, port = endpoints[task]
    return (
        f"{this_task} cannot start its cluster: port {port} on {host} ({task}'s address in "
        "TF_CONFIG) answers but is not a TensorFlow server of this cluster (it accepts "
        "connections but does not speak gRPC): another program listens there. Stop that "
        f"program, or give {task} a free port in TF_CONFIG on every task."
    )


def probe(host: str, port: int, deadline: float) -> str:
    """What answers at `host`:`port`: UP (a gRPC server or a waiting task), FOREIGN or DOWN."""
    # A host that drops packets, or a program that never answers, must not
    # hold the wait past its deadline.
    timeout = min(1.0, max(0.05, deadline - time.monotonic()))
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return DOWN
    with connection:
        try:
            connection.sendall(_HTTP2_PREFACE + _HTTP2_EMPTY_SETTINGS)
            header = b""
            while len(header) < _FRAME_HEADER_BYTES:
                received = connection.recv(_FRAME_HEADER_BYTES - len(header))
                if not received:
                    break
                header += received
        except OSError:  # a reset or a timeout: not a gRPC server's answer
            return FOREIGN
    is_settings = (
        len(header) == _FRAME_HEADER_BYTES
        and header[3] == _SETTINGS_FRAME_TYPE
        and header[5:9] == bytes(4)  # stream 0
    )
    return UP if is_settings else FOREIGN


class _WaitingListener:
    """This task's port while it waits: a thread answers peers' probes as its gRPC server will.

    A thread, because two waiting tasks probe each other at once: each must
    answer while its own probe waits for the other's answer.
    """

    def __init__(self, task: str, address: str | None):
        self._task, self._address = task, address
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _WaitingListener:
        if self._address is not None:
            listener = bind_own_port(self._task, self._address)
            listener.listen(16)
            self._thread = threading.Thread(
                target=self._answer, args=(listener,), name=f"{self._task}-waiting", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _answer(self, listener: socket.socket) -> None:
        with listener:
            while not self._stop.is_set():
                ready, _, _ = select.select([listener], [], [], _PROBE_INTERVAL_SECONDS)
                if not ready:
                    continue
                with contextlib.suppress(OSError), listener.accept()[0] as connection:
                    # The peer's preface first: closing with unread input would reset
                    # the connection and could drop the answer.
                    connection.settimeout(_PROBE_INTERVAL_SECONDS)
                    connection.recv(len(_HTTP2_PREFACE) + len(_HTTP2_EMPTY_SETTINGS))
                    connection.sendall(_HTTP2_EMPTY_SETTINGS)
