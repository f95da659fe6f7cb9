"""Reads a cluster task's place from what its scheduler gives it (TF_CONFIG, an srun step,
a Kubernetes Indexed Job) without TensorFlow; `task_cluster` picks the one that applies.

Every value is checked, and counted before anything of its size is built: a
malformed environment is a sentence naming the variable, never a traceback.

TensorFlow's own SlurmClusterResolver and KubernetesClusterResolver are not
used (BUILD.md, "Clusters from a scheduler"): the first expands node lists by
running `scontrol`, orders tasks by sorted host name rather than by SLURM's
placement, and sets CUDA_VISIBLE_DEVICES; the second needs the `kubernetes`
client and the right to list pods. Both import TensorFlow, which a task
refused for its environment should never start.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import Mapping

from loops.cluster.environment_values import (
    MOST_DIGITS,
    MOST_TASKS,
    check_dns_name,
    is_dns_label,
    is_whole_number,
    shown,
    task_count,
    whole_number,
)

# Set beside TF_CONFIG once this process has found its cluster: what found it.
FOUND_BY_VARIABLE = "LOOPS_CLUSTER_FOUND_BY"
# What a Kubernetes Indexed Job's pods are told by their manifest (`loops-launch
# --print=kubernetes` writes them): the Job's completions, its headless Service
# and, optionally, the Job's name (else read from the pod's host name, `<job>-<index>`).
KUBERNETES_TASKS_VARIABLE = "LOOPS_CLUSTER_TASKS"
KUBERNETES_SERVICE_VARIABLE = "LOOPS_CLUSTER_SERVICE"
KUBERNETES_JOB_VARIABLE = "LOOPS_CLUSTER_JOB"
# Every pod has its own address, so one port serves them all.
DEFAULT_KUBERNETES_PORT = 2222
# SLURM tasks that share a node need a port each (the base plus the task's
# place on its node). The base follows the job id, so that two jobs sharing a
# node rarely pick the same ports: 1000 slots of this many ports from 20000.
SLURM_PORT_FIRST, SLURM_PORTS_PER_JOB, SLURM_PORT_SLOTS = 20000, 40, 1000
# A host list item's parts: plain text of a host name, or a bracket group.
_HOSTLIST_ITEM = re.compile(r"[A-Za-z0-9._-]+|\[[^\[\]]*\]")
_NUMBER = f"([0-9]{{1,{MOST_DIGITS}}})"
_TASKS_PER_NODE_ITEM = re.compile(rf"{_NUMBER}(?:\(x{_NUMBER}\))?")
# The longest node list or tasks per node read: MOST_TASKS names of 10 characters.
_MOST_LIST_CHARACTERS = MOST_TASKS * 10
# A bracket group, unexpanded: (first, last, digits to pad to) per piece.
_Ranges = list[tuple[int, int, int]]
# srun sets these for the tasks of a job step, and only for them.
SLURM_STEP_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS")
# Where a step's nodes are listed: the step's own list first, then the job's.
_NODE_LIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_SRUN_FIX = "run the command under srun (in an sbatch script: srun <command>)"


@dataclasses.dataclass(frozen=True)
class FoundCluster:
    """A cluster and this task's place in it, and what found them."""

    found_by: str  # "tf_config", "slurm" or "kubernetes"
    cluster: dict[str, list[str]]  # task type -> addresses in index order
    task_type: str
    task_index: int

    def tf_config(self) -> str:
        """The TF_CONFIG JSON that names this cluster and task."""
        task = {"type": self.task_type, "index": self.task_index}
        return json.dumps({"cluster": self.cluster, "task": task})

    def line(self) -> str:
        """What a task prints: `cluster: slurm, 4 workers, this task worker 2 at gpu03:23456`."""
        counts = ", ".join(
            f"{len(addresses)} {task_type}"
            + ("s" if len(addresses) > 1 and task_type != "ps" else "")
            for task_type, addresses in self.cluster.items()
        )
        members = self.cluster.get(self.task_type, [])
        place = members[self.task_index] if self.task_index < len(members) else "no address"
        found_by = "TF_CONFIG" if self.found_by == "tf_config" else self.found_by
        this_task = f"{self.task_type} {self.task_index}"
        return f"cluster: {found_by}, {counts}, this task {this_task} at {place}"


def expand_hostlist(text: str, variable: str | None = None) -> list[str]:
    """SLURM's compressed host list as host names: `gpu[01-03,07],cpu3` -> gpu01 ... cpu3.

    A name may hold several bracket groups (`r[1-2]n[1-2]`: r1n1, r1n2, r2n1,
    r2n2); a range keeps the zero padding of its first number. The names are
    counted before any is built: a list of more than MOST_TASKS is refused.
    `variable`: the variable `text` comes from, for the sentences.

    Raises:
        ValueError: unbalanced brackets, an empty item or one with characters no
            host name has, a range that runs backwards, too many names.
    """
    if len(text) > _MOST_LIST_CHARACTERS:
        raise ValueError(_bad_hostlist(text, variable, f"it is {len(text)} characters long"))
    parts_of_items: list[list[str | _Ranges]] = []
    for item in _split_top_level(text, variable):
        parts = _HOSTLIST_ITEM.findall(item)
        if not item or "".join(parts) != item:
            why = (
                f"{shown(item)} is not a host name or name[range] (of letters, digits, '.', "
                "'-' and '_')"
            )
            raise ValueError(_bad_hostlist(text, variable, why))
        parts_of_items.append(
            [
                _bracket_numbers(text, variable, part[1:-1]) if part.startswith("[") else part
                for part in parts
            ]
        )
    count = sum(math.prod(map(_choices, parts)) for parts in parts_of_items)
    if count > MOST_TASKS:
        why = f"it names {count} nodes, more than the {MOST_TASKS} a cluster here may have"
        raise ValueError(_bad_hostlist(text, variable, why))
    return [
        "".join(pieces)
        for parts in parts_of_items
        for pieces in itertools.product(*map(_expanded, parts))
    ]


def _split_top_level(text: str, variable: str | None) -> list[str]:
    items, depth, start = [], 0, 0
    for position, character in enumerate(text):
        depth += {"[": 1, "]": -1}.get(character, 0)
        if depth not in (0, 1):
            raise ValueError(_bad_hostlist(text, variable, "its brackets do not pair up"))
        if character == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    if depth:
        raise ValueError(_bad_hostlist(text, variable, "its brackets do not pair up"))
    return [*items, text[start:]]


def _bracket_numbers(text: str, variable: str | None, inside: str) -> _Ranges:
    ranges = []
    for piece in inside.split(","):
        first, dash, last = piece.partition("-")
        if not is_whole_number(first) or (dash and not is_whole_number(last)):
            why = f"[{shown(inside)[1:-1]}] holds {shown(piece)}, not N or N-M"
            raise ValueError(_bad_hostlist(text, variable, why))
        if dash and int(last) < int(first):
            raise ValueError(_bad_hostlist(text, variable, f"the range {piece!r} runs backwards"))
        ranges.append((int(first), int(last) if dash else int(first), len(first)))
    return ranges


def _choices(part: str | _Ranges) -> int:
    """How many names one part of a host name gives: 1 for plain text."""
    return 1 if isinstance(part, str) else sum(last - first + 1 for first, last, _ in part)


def _expanded(part: str | _Ranges) -> list[str]:
    if isinstance(part, str):
        return [part]
    return [
        str(number).zfill(width) for first, last, width in part for number in range(first, last + 1)
    ]


def _bad_hostlist(text: str, variable: str | None, why: str) -> str:
    named = f"{variable}={shown(text)}" if variable else shown(text)
    return (
        f"SLURM's node list {named} cannot be read: {why}. It should look like "
        "gpu[01-04,07],cpu3; run the task under srun, which sets it."
    )


def expand_tasks_per_node(text: str, variable: str | None = None) -> list[int]:
    """SLURM's tasks per node, one count per node: `2(x3),1` -> [2, 2, 2, 1].

    The nodes and tasks are counted before the list is built: more than
    MOST_TASKS of either is refused. `variable`: where `text` comes from.

    Raises:
        ValueError: an item that is not N or N(xM), too many nodes or tasks.
    """
    named = f"{variable}={shown(text)}" if variable else shown(text)
    fix = "run the task under srun, which sets it"
    if len(text) > _MOST_LIST_CHARACTERS:
        raise ValueError(
            f"SLURM's tasks per node {named} cannot be read: it is {len(text)} characters "
            f"long; {fix}."
        )
    counts: list[tuple[int, int]] = []
    for item in text.split(","):
        match = _TASKS_PER_NODE_ITEM.fullmatch(item)
        if match is None:
            raise ValueError(
                f"SLURM's tasks per node {named} cannot be read: {shown(item)} is not N or "
                f"N(xM) (like 2(x3),1); {fix}."
            )
        counts.append((int(match[1]), int(match[2] or 1)))
    nodes = sum(repeats for _, repeats in counts)
    tasks = sum(tasks * repeats for tasks, repeats in counts)
    if max(nodes, tasks) > MOST_TASKS:
        raise ValueError(
            f"SLURM's tasks per node {named} gives {tasks} task(s) on {nodes} node(s), more "
            f"than the {MOST_TASKS} a cluster here may have; {fix}."
        )
    return [tasks for tasks, repeats in counts for _ in range(repeats)]


def roles(strategy: str, count: int, num_ps: int, where: str) -> list[tuple[str, int]]:
    """The (task type, index) of each of `count` tasks, in rank order, for `strategy`.

    multi_worker_mirrored: every task a worker. parameter_server: task 0 the
    chief (the coordinator), the next `num_ps` parameter servers, the rest workers.

    Raises:
        ValueError: too few tasks for the parameter servers, a chief and a worker,
            or parameter servers asked of a strategy that has none.
    """
    if strategy != "parameter_server":
        if num_ps:
            raise ValueError(
                f"--cluster_num_ps={num_ps} asks for parameter servers, which only "
                f"--strategy=parameter_server has; drop it for --strategy={strategy}."
            )
        return [("worker", index) for index in range(count)]
    if num_ps < 1 or count < num_ps + 2:
        raise ValueError(
            f"--strategy=parameter_server on {where} needs --cluster_num_ps >= 1 and at least "
            f"--cluster_num_ps + 2 tasks (a chief, the parameter servers, a worker), got "
            f"--cluster_num_ps={num_ps} and {count} task(s); start more tasks or pass "
            "--cluster_num_ps=1."
        )
    return [
        ("chief", 0),
        *(("ps", index) for index in range(num_ps)),
        *(("worker", index) for index in range(count - num_ps - 1)),
    ]


def _cluster_of(
    found_by: str, addresses: list[str], places: list[tuple[str, int]], rank: int
) -> FoundCluster:
    cluster: dict[str, list[str]] = {}
    for (task_type, _), address in zip(places, addresses):
        cluster.setdefault(task_type, []).append(address)
    task_type, index = places[rank]
    return FoundCluster(found_by, cluster, task_type, index)


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str | None]:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return names[0], None


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """Whether srun started this process as a task of a job step.

    SLURM sets SLURM_PROCID, SLURM_NTASKS and the node list in an sbatch
    script's own shell too (task 0 of the batch step); only srun's tasks get
    the step's variables.
    """
    return any(name in environ for name in SLURM_STEP_VARIABLES)


def slurm_cluster(
    environ: Mapping[str, str], strategy: str, port: int | None = None, num_ps: int = 0
) -> FoundCluster:
    """The cluster of an srun job step: one task per SLURM task, placed block by block.

    Task `SLURM_PROCID` serves on its node at `port` plus its place among that
    node's tasks; `port` None: a base that follows SLURM_JOB_ID. The step's
    variables (SLURM_STEP_*) are read before the job's.

    Raises:
        ValueError: a sentence for each inconsistency: a rank outside the step,
            tasks per node that do not add up to the task count or do not match
            the node list, a node listed twice (two tasks on one port), a
            placement other than block, a task on another node than its rank's;
            and for each malformed variable, too many nodes or tasks included.
    """
    rank = whole_number(environ, "SLURM_PROCID", "this task's rank", _SRUN_FIX)
    tasks_name, _ = _first(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    count = task_count(environ, tasks_name, "the step's task count", _SRUN_FIX)
    nodes_name, node_text = _first(environ, _NODE_LIST_VARIABLES)
    if node_text is None:
        raise ValueError(
            f"SLURM_PROCID is set but no node list is (SLURM_STEP_NODELIST); {_SRUN_FIX}."
        )
    hosts = expand_hostlist(node_text, nodes_name)
    per_node = _tasks_per_node(environ, hosts, count, nodes_name)
    if not 0 <= rank < count:
        raise ValueError(
            f"SLURM_PROCID={rank} is outside the step's {count} task(s) ({tasks_name}); each "
            "task needs its own rank below the task count, which srun gives."
        )
    repeated = sorted(host for host, times in collections.Counter(hosts).items() if times > 1)
    if repeated:
        raise ValueError(
            f"{nodes_name}={shown(node_text)} lists {', '.join(repeated[:10])} more than once, "
            "so two tasks would serve on one port; list each node once (srun does)."
        )
    base = _slurm_port(environ, port)
    if base + max(per_node) - 1 > 65535:
        raise ValueError(
            f"Port {base} plus {max(per_node)} tasks on a node runs past 65535; pass a lower "
            "--cluster_port."
        )
    placed = [(host, local) for host, tasks in zip(hosts, per_node) for local in range(tasks)]
    _check_placement(environ, rank, placed, (nodes_name, node_text, hosts))
    addresses = [f"{host}:{base + local}" for host, local in placed]
    where = f"SLURM ({count} task(s))"
    return _cluster_of("slurm", addresses, roles(strategy, count, num_ps, where), rank)


def _tasks_per_node(
    environ: Mapping[str, str], hosts: list[str], count: int, nodes_name: str
) -> list[int]:
    name, text = _first(environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if text is None:
        if count % len(hosts):
            raise ValueError(
                f"{count} SLURM task(s) do not spread evenly over the {len(hosts)} node(s) of "
                f"{nodes_name}, and SLURM_STEP_TASKS_PER_NODE, which says how they spread, is "
                "unset; run the command under srun, which sets it."
            )
        return [count // len(hosts)] * len(hosts)
    per_node = expand_tasks_per_node(text, name)
    if len(per_node) != len(hosts):
        listed = ", ".join(hosts[:10]) + (", ..." if len(hosts) > 10 else "")
        raise ValueError(
            f"{name}={shown(text)} gives {len(per_node)} node(s) but {nodes_name} lists "
            f"{len(hosts)} ({listed}); both must come from the same srun step."
        )
    if sum(per_node) != count:
        raise ValueError(
            f"{name}={shown(text)} adds up to {sum(per_node)} task(s), but the step has "
            f"{count}; both must come from the same srun step."
        )
    return per_node


def _slurm_port(environ: Mapping[str, str], port: int | None) -> int:
    if port is not None:
        return port
    job = environ.get("SLURM_JOB_ID", "0")
    slot = int(job) % SLURM_PORT_SLOTS if is_whole_number(job) else 0
    return SLURM_PORT_FIRST + slot * SLURM_PORTS_PER_JOB


def _check_placement(
    environ: Mapping[str, str],
    rank: int,
    placed: list[tuple[str, int]],
    node_list: tuple[str, str, list[str]],
) -> None:
    """This task runs where block placement puts its rank (SLURM says where it runs).

    `node_list`: the variable that gave the nodes, its value, the node names.
    """
    nodes_name, node_text, hosts = node_list
    host, local = placed[rank]
    node_id = local_id = None
    if "SLURM_NODEID" in environ:
        node_id = whole_number(environ, "SLURM_NODEID", "this task's node", _SRUN_FIX)
        if node_id >= len(hosts):
            raise ValueError(
                f"SLURM_NODEID={node_id} is outside the {len(hosts)} node(s) of {nodes_name}="
                f"{shown(node_text)} (numbered from 0); both must come from the same srun step: "
                f"{_SRUN_FIX}."
            )
    if "SLURM_LOCALID" in environ:
        local_id = whole_number(environ, "SLURM_LOCALID", "its place on its node", _SRUN_FIX)
    here = environ.get("SLURMD_NODENAME")
    if here and here != host:
        actual = f"on {shown(here)}"
    elif node_id is not None and hosts[node_id] != host:
        actual = f"on node {node_id} ({hosts[node_id]})"
    elif local_id is not None and local_id != local:
        actual = f"as task {local_id} of its node"
    else:
        return
    raise ValueError(
        f"SLURM runs task {rank} {actual}, but placing tasks block by block over the node "
        f"list puts it on {host} as task {local} of that node, which the other tasks will "
        "look for; start the step with srun --distribution=block."
    )


def kubernetes_cluster(
    environ: Mapping[str, str], strategy: str, port: int | None = None, num_ps: int = 0
) -> FoundCluster:
    """The cluster of a Kubernetes Indexed Job whose pods sit behind a headless Service.

    Pod i of Job `job` is reachable as `<job>-<i>.<service>` (the Job's pods
    name the Service as their subdomain); every pod serves on `port` (None: 2222).

    Raises:
        ValueError: the index, the task count or the Service missing, an index
            outside the task count, a host name that is not `<job>-<index>`, a
            task count past MOST_TASKS, a Service or Job name that is not a DNS name.
    """
    fix = "run the pod in an Indexed Job (loops-launch --print=kubernetes writes one)"
    index = whole_number(environ, "JOB_COMPLETION_INDEX", "this pod's index in its Job", fix)
    count = task_count(
        environ,
        KUBERNETES_TASKS_VARIABLE,
        "the Job's completions",
        f"set it in the pod's environment to the Job's completions; {fix}",
    )
    service = environ.get(KUBERNETES_SERVICE_VARIABLE, "").strip()
    if not service:
        raise ValueError(
            f"{KUBERNETES_SERVICE_VARIABLE} is unset: it names the headless Service the Job's "
            f"pods name as their subdomain, through which they reach each other; set it ({fix})."
        )
    check_dns_name(
        KUBERNETES_SERVICE_VARIABLE,
        service,
        "the headless Service the Job's pods name as their subdomain",
        "set it to that Service's name",
    )
    if not 0 <= index < count:
        raise ValueError(
            f"JOB_COMPLETION_INDEX={index} is outside the Job's {count} pod(s) "
            f"({KUBERNETES_TASKS_VARIABLE}={count}); set {KUBERNETES_TASKS_VARIABLE} to the "
            "Job's completions."
        )
    job = _kubernetes_job(environ, index, count)
    own_port = DEFAULT_KUBERNETES_PORT if port is None else port
    addresses = [f"{job}-{member}.{service}:{own_port}" for member in range(count)]
    where = f"Kubernetes ({count} pod(s))"
    return _cluster_of("kubernetes", addresses, roles(strategy, count, num_ps, where), index)


def _kubernetes_job(environ: Mapping[str, str], index: int, count: int) -> str:
    """The Job's name, whose pods' host names `<job>-<index>` must be DNS labels."""
    job = environ.get(KUBERNETES_JOB_VARIABLE, "").strip()
    if job:
        check_dns_name(
            KUBERNETES_JOB_VARIABLE, job, "the Indexed Job's name", "set it to the Job's name"
        )
    else:
        hostname = environ.get("HOSTNAME", "")
        job, dash, suffix = hostname.rpartition("-")
        if not (job and dash and suffix == str(index)):
            raise ValueError(
                f"This pod's host name {shown(hostname)} is not <job>-{index}, which names the "
                f"pods of an Indexed Job; set {KUBERNETES_JOB_VARIABLE} to the Job's name."
            )
    last_pod = f"{job}-{count - 1}"
    if not is_dns_label(last_pod):
        raise ValueError(
            f"The Job's pods are named {job}-0 to {last_pod}, and {shown(last_pod)} is not a DNS "
            "label (1-63 lower-case letters, digits and '-', RFC 1123), so its address would "
            f"not resolve; give the Job a shorter name of such characters "
            f"({KUBERNETES_JOB_VARIABLE})."
        )
    return job


def tf_config_cluster(environ: Mapping[str, str]) -> FoundCluster | None:
    """The cluster TF_CONFIG names, when it parses as one (else the checks name what is wrong)."""
    try:
        config = json.loads(environ.get("TF_CONFIG") or "{}")
        cluster = {
            str(task_type): list(tasks.values()) if isinstance(tasks, dict) else list(tasks)
            for task_type, tasks in config["cluster"].items()
        }
        task = config["task"]
        return FoundCluster("tf_config", cluster, str(task["type"]), int(task["index"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def scheduler_tasks(environ: Mapping[str, str]) -> tuple[str, int] | None:
    """(the scheduler, how many tasks it started of this command) when it started several.

    An sbatch script's own shell is no task of a step: a command run there runs once.
    """
    if in_srun_step(environ):
        _, text = _first(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
        if text and is_whole_number(text) and int(text) > 1:
            return "srun", int(text)
    text = environ.get(KUBERNETES_TASKS_VARIABLE, "")
    if "JOB_COMPLETION_INDEX" in environ and is_whole_number(text) and int(text) > 1:
        return "the Kubernetes Job", int(text)
    return None


def found_by(environ: Mapping[str, str] | None = None) -> str | None:
    """What found the cluster this process adopted as its TF_CONFIG (FOUND_BY_VARIABLE)."""
    environ = os.environ if environ is None else environ
    return environ.get(FOUND_BY_VARIABLE)


def peers_resolve_now(environ: Mapping[str, str] | None = None) -> bool:
    """Whether every task's host name must resolve before the tasks start.

    Not in Kubernetes: a pod's name enters the Service's DNS only once the pod
    runs, so a peer may not resolve yet; the wait for the cluster retries it.
    """
    return found_by(environ) != "kubernetes"
