"""Reads and checks TF_CONFIG without TensorFlow: a cluster task refuses a bad one before work."""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from loops.cluster import scheduler_cluster
from loops.vocabulary.choices import CLUSTER_STRATEGIES  # noqa: F401  (re-exported)
from loops.vocabulary.whole_numbers import is_whole

# The task types of a ParameterServerStrategy cluster: the coordinator and its servers.
PARAMETER_SERVER_TASKS = ("chief", "worker", "ps")
_SHAPE = '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}'


def host_and_port(task: str, address: Any, *, resolve: bool = True) -> tuple[str, int]:
    """The host and port of `task`'s TF_CONFIG `address` (`host:port`, `[v6]:port`).

    Raises:
        ValueError: `address` is not a host:port string, its port is outside
            1..65535, or (where `resolve`) its host does not resolve.
    """
    if not isinstance(address, str):
        raise ValueError(
            f"TF_CONFIG gives {task} the address {address!r}, which is not a "
            '"host:port" string; write it in quotes like "10.0.0.2:2222" (the same cluster '
            "on every task)."
        )
    host, colon, port_text = address.rpartition(":")
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
    if not resolve:
        return host, port
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if scheduler_cluster.found_by() == "slurm":
            raise ValueError(_slurm_node_unresolved(task, host, address, error)) from error
        raise ValueError(
            f"TF_CONFIG gives {task} the host {host!r} (in {address!r}), which does not "
            f"resolve ({error.strerror}); fix its spelling or give its IP address."
        ) from error
    return host, port


def _slurm_node_unresolved(task: str, host: str, address: str, error: socket.gaierror) -> str:
    return (
        f"SLURM's node list names the node {host!r} for {task} ({address}), and that name does "
        f"not resolve on this node ({error.strerror}): the tasks reach each other by node "
        "name, while SLURM itself needs only each node's NodeAddr. Make every node name "
        "resolve on every node (DNS or /etc/hosts), or set TF_CONFIG yourself on every task "
        f"with addresses that do (like {_SHAPE}); it is read before SLURM's variables."
    )


def read_tf_config() -> dict[str, Any]:
    """$TF_CONFIG as a JSON object; {} when it is unset or empty.

    Raises:
        ValueError: TF_CONFIG is not JSON, or not a JSON object.
    """
    raw = os.environ.get("TF_CONFIG", "")
    try:
        config = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as error:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({error}): {raw!r}. Set it to {_SHAPE} or unset it."
        ) from error
    if not isinstance(config, dict):
        raise ValueError(
            f"TF_CONFIG is {raw!r}, a JSON {type(config).__name__}, not an object; set it "
            f"to {_SHAPE} or unset it."
        )
    return config


def cluster_addresses(
    config: Mapping[str, Any], *, resolve: bool = True
) -> dict[str, dict[int, str]]:
    """TF_CONFIG's cluster as {task type: {index: address}}, every address checked.

    A task type's addresses may be a list (indices 0, 1, ...) or, as
    tf.train.ClusterSpec allows, an object from index to address. `resolve`:
    every host must resolve now (`scheduler_cluster.peers_resolve_now`).

    Raises:
        ValueError: the cluster is not an object of lists, or an address is
            bad (`host_and_port`).
    """
    cluster = config.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ValueError(
            f"TF_CONFIG's cluster is {cluster!r}, not an object of task types; write it "
            'like "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}.'
        )
    addresses: dict[str, dict[int, str]] = {}
    for task_type, tasks in cluster.items():
        if isinstance(tasks, list):
            tasks = dict(enumerate(tasks))
        elif isinstance(tasks, dict) and all(str(index).isdigit() for index in tasks):
            tasks = {int(index): address for index, address in tasks.items()}
        else:
            raise ValueError(
                f"TF_CONFIG's cluster gives {task_type!r} the tasks {tasks!r}, not a list "
                f'of addresses; write it like "{task_type}": ["10.0.0.1:2222"].'
            )
        for index, address in tasks.items():
            host_and_port(f"{task_type}_{index}", address, resolve=resolve)
        addresses[task_type] = tasks
    return addresses


def this_task(
    config: Mapping[str, Any], addresses: Mapping[str, Mapping[int, str]]
) -> tuple[str, int]:
    """The (type, index) TF_CONFIG's "task" names, checked to be a task of its cluster.

    Raises:
        ValueError: "task" is missing or malformed, or names a task the cluster lacks.
    """
    task = config.get("task")
    task_type = task.get("type") if isinstance(task, dict) else None
    index = task.get("index") if isinstance(task, dict) else None
    # TensorFlow reads the index with int(): 1 and "1" both name task 1.
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if not isinstance(task_type, str) or not is_whole(index):
        found = 'has no "task"' if task is None else f'has "task": {json.dumps(task)}'
        raise ValueError(
            f"TF_CONFIG {found}; name this process's task in it like "
            '"task": {"type": "worker", "index": 0}, a type and index of its cluster.'
        )
    if task_type not in addresses:
        raise ValueError(
            f"TF_CONFIG names this task {task_type}_{index}, but its cluster has no "
            f"{task_type!r} tasks (it has {', '.join(map(repr, addresses))}); give the task "
            'a type of its cluster in TF_CONFIG\'s "task", or add it to the cluster on every task.'
        )
    if index not in addresses[task_type]:
        raise ValueError(
            f"TF_CONFIG names this task {task_type}_{index}, but its cluster has "
            f"{len(addresses[task_type])} {task_type} task(s) (indices "
            f"{sorted(addresses[task_type])}); give each task its own index among those in "
            'TF_CONFIG\'s "task".'
        )
    return task_type, index


def check_cluster(strategy: str) -> None:
    """Checks TF_CONFIG for --strategy=`strategy` (one of CLUSTER_STRATEGIES), before any work.

    The cluster must exist, every address must be host:port, this task must
    be one of the cluster's, and its own port must be free: TensorFlow would
    otherwise fail with a raw error, or block.

    Raises:
        ValueError: a sentence naming the bad value and the fix.
    """
    config = read_tf_config()
    addresses = cluster_addresses(config, resolve=scheduler_cluster.peers_resolve_now())
    if not addresses:
        raise ValueError(
            f"--strategy={strategy} runs one process per task of a cluster, but no cluster "
            f"was found: TF_CONFIG is {'unset' if not config else repr(config)}. Set "
            f"TF_CONFIG on every task (like {_SHAPE}), start the tasks with loops-launch "
            "--num_workers=N, or use --strategy=mirrored on one machine."
        )
    if strategy == "parameter_server":
        _check_parameter_server_cluster(addresses)
    task_type, index = this_task(config, addresses)
    if strategy == "parameter_server" and task_type not in PARAMETER_SERVER_TASKS:
        raise ValueError(
            f"--strategy=parameter_server runs tasks of type chief, worker or ps; TF_CONFIG "
            f"names this task {task_type!r}. Give it one of those types."
        )
    check_port_free(f"{task_type}_{index}", addresses[task_type][index])


def _check_parameter_server_cluster(addresses: Mapping[str, Mapping[int, str]]) -> None:
    if not (addresses.get("ps") and addresses.get("worker")):
        raise ValueError(
            "--strategy=parameter_server needs TF_CONFIG naming 'ps' and "
            f"'worker' tasks (and one 'chief'), got cluster={dict(addresses)!r}. Set TF_CONFIG "
            "on every task (see BUILD.md, 'Several machines'), or start the run with "
            "python -m loops.cluster.launch --num_workers=N --num_ps=M."
        )
    chiefs = list(addresses.get("chief", {}).values())
    if len(chiefs) != 1:
        raise ValueError(
            "--strategy=parameter_server needs exactly one 'chief' task in TF_CONFIG "
            f"(the coordinator that runs the training loop), got chief={chiefs!r}. Pass "
            "--num_ps to loops-launch, which adds one, or add a chief task to TF_CONFIG "
            "on every task."
        )


def bind_own_port(task: str, address: str) -> socket.socket:
    """A socket bound to `address`'s port on every interface, as TensorFlow's server binds it.

    Raises:
        ValueError: the port is taken by another process, or needs privileges.
    """
    # It binds every interface: whether the host resolves does not matter here.
    host, port = host_and_port(task, address, resolve=False)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bound = socket.socket(family, socket.SOCK_STREAM)
    try:
        # Connections of an earlier run in TIME_WAIT must not block the port.
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(("", port))
    except OSError as error:
        bound.close()
        if error.errno == errno.EACCES:
            raise ValueError(
                f"Port {port} of {task} ({address} in TF_CONFIG) cannot be opened by this "
                f"user ({error.strerror}): ports below 1024 need privileges. Give the task a "
                "port above 1023 in TF_CONFIG on every task."
            ) from error
        if error.errno != errno.EADDRINUSE:
            raise
        raise ValueError(
            f"Port {port} of {task} ({address} in TF_CONFIG) is taken by another "
            "process; stop it (an earlier run's task?) or give this task a free "
            "port in TF_CONFIG on every task."
        ) from error
    return bound


def check_port_free(task: str, address: str) -> None:
    """Raises ValueError (see `bind_own_port`) unless `task`'s port is free now."""
    bind_own_port(task, address).close()


def pass_worker(strategy: str) -> tuple[int, int] | None:
    """This task's (index, count) among the tasks that each run the binary's data passes
    under `strategy`: the chief and workers of a multi_worker_mirrored cluster in TF_CONFIG
    (chief first, then workers by index); None for one process or any other strategy (a
    parameter-server cluster's coordinator passes over the data alone).

    Raises:
        ValueError: TF_CONFIG as `read_tf_config`, `cluster_addresses` or `this_task`.
    """
    config = read_tf_config()
    if strategy != "multi_worker_mirrored" or not config:
        return None
    addresses = cluster_addresses(config, resolve=False)
    tasks = [
        (kind, index) for kind in ("chief", "worker") for index in sorted(addresses.get(kind, {}))
    ]
    if len(tasks) < 2:
        return None
    return tasks.index(this_task(config, addresses)), len(tasks)
