"""Finds a cluster task's place from its scheduler (TF_CONFIG, SLURM's srun, a Kubernetes
Indexed Job) and writes it as the TF_CONFIG TensorFlow reads, without TensorFlow.

TensorFlow's own SlurmClusterResolver and KubernetesClusterResolver are not
used (BUILD.md, "Clusters from a scheduler"): the first expands node lists by
running `scontrol`, orders tasks by sorted host name rather than by SLURM's
placement, and sets CUDA_VISIBLE_DEVICES; the second needs the `kubernetes`
client and the right to list pods. Both import TensorFlow, which a task
refused for its environment should never start.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from collections.abc import Mapping, MutableMapping

from loops.vocabulary.choices import CLUSTER_SOURCES, CLUSTER_STRATEGIES

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
_HOSTLIST_ITEM = re.compile(r"[^\[\],]+|\[[^\[\]]*\]")
_TASKS_PER_NODE_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_HOW_TO_GIVE = (
    "start the tasks with srun, in a Kubernetes Indexed Job (loops-launch --print=slurm or "
    "--print=kubernetes writes either), with loops-launch --num_workers=N on one machine, or "
    'set TF_CONFIG on every task (like {"cluster": {"worker": ["host:port", ...]}, "task": '
    '{"type": "worker", "index": 0}})'
)


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


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list as host names: `gpu[01-03,07],cpu3` -> gpu01 ... cpu3.

    A name may hold several bracket groups (`r[1-2]n[1-2]`: r1n1, r1n2, r2n1,
    r2n2); a range keeps the zero padding of its first number.

    Raises:
        ValueError: unbalanced brackets, an empty item or a range that runs backwards.
    """
    names: list[str] = []
    for item in _split_top_level(text):
        parts = _HOSTLIST_ITEM.findall(item)
        if not item or "".join(parts) != item:
            raise ValueError(_bad_hostlist(text, f"{item!r} is not a host name or name[range]"))
        choices = [
            _expand_brackets(text, part[1:-1]) if part.startswith("[") else [part] for part in parts
        ]
        names.extend("".join(pieces) for pieces in itertools.product(*choices))
    return names


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for position, character in enumerate(text):
        depth += {"[": 1, "]": -1}.get(character, 0)
        if depth not in (0, 1):
            raise ValueError(_bad_hostlist(text, "its brackets do not pair up"))
        if character == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    if depth:
        raise ValueError(_bad_hostlist(text, "its brackets do not pair up"))
    return [*items, text[start:]]


def _expand_brackets(text: str, inside: str) -> list[str]:
    values: list[str] = []
    for piece in inside.split(","):
        first, dash, last = piece.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(_bad_hostlist(text, f"[{inside}] holds {piece!r}, not N or N-M"))
        if dash and int(last) < int(first):
            raise ValueError(_bad_hostlist(text, f"the range {piece!r} runs backwards"))
        stop = int(last) if dash else int(first)
        values.extend(str(number).zfill(len(first)) for number in range(int(first), stop + 1))
    return values


def _bad_hostlist(text: str, why: str) -> str:
    return (
        f"SLURM's node list {text!r} cannot be read: {why}. It should look like "
        "gpu[01-04,07],cpu3; run the task under srun, which sets it."
    )


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node, one count per node: `2(x3),1` -> [2, 2, 2, 1].

    Raises:
        ValueError: an item that is not N or N(xM).
    """
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_PER_NODE_ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(
                f"SLURM's tasks per node {text!r} cannot be read: {item!r} is not N or N(xM) "
                "(like 2(x3),1); run the task under srun, which sets it."
            )
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


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


def _whole(environ: Mapping[str, str], name: str, what: str, fix: str) -> int:
    value = environ.get(name)
    if value is None or not value.strip().isdigit():
        found = "unset" if value is None else repr(value)
        raise ValueError(f"{name} ({what}) is {found}, not a whole number; {fix}.")
    return int(value)


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str | None]:
    for name in names:
        if environ.get(name):
            return name, environ[name]
    return names[0], None


def slurm_cluster(
    environ: Mapping[str, str], strategy: str, port: int | None = None, num_ps: int = 0
) -> FoundCluster:
    """The cluster of an srun job step: one task per SLURM task, placed block by block.

    Task `SLURM_PROCID` serves on its node at `port` plus its place among that
    node's tasks; `port` None: a base that follows SLURM_JOB_ID.

    Raises:
        ValueError: a sentence for each inconsistency: a rank outside the step,
            tasks per node that do not add up to the task count or do not match
            the node list, a node listed twice (two tasks on one port), a
            placement other than block, a task on another node than its rank's.
    """
    fix = "run the command under srun (in an sbatch script: srun <command>)"
    rank = _whole(environ, "SLURM_PROCID", "this task's rank", fix)
    tasks_name, _ = _first(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    count = _whole(environ, tasks_name, "the step's task count", fix)
    nodes_name, node_text = _first(
        environ, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    )
    if node_text is None:
        raise ValueError(f"SLURM_PROCID is set but no node list is (SLURM_STEP_NODELIST); {fix}.")
    hosts = expand_hostlist(node_text)
    per_node = _tasks_per_node(environ, hosts, count, nodes_name)
    if not 0 <= rank < count:
        raise ValueError(
            f"SLURM_PROCID={rank} is outside the step's {count} task(s) ({tasks_name}); each "
            "task needs its own rank below the task count, which srun gives."
        )
    repeated = sorted({host for host in hosts if hosts.count(host) > 1})
    if repeated:
        raise ValueError(
            f"{nodes_name}={node_text!r} lists {', '.join(repeated)} more than once, so two "
            "tasks would serve on one port; list each node once (srun does)."
        )
    base = _slurm_port(environ, port)
    if base + max(per_node) - 1 > 65535:
        raise ValueError(
            f"Port {base} plus {max(per_node)} tasks on a node runs past 65535; pass a lower "
            "--cluster_port."
        )
    placed = [(host, local) for host, tasks in zip(hosts, per_node) for local in range(tasks)]
    _check_placement(environ, rank, placed, hosts)
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
    per_node = expand_tasks_per_node(text)
    if len(per_node) != len(hosts):
        raise ValueError(
            f"{name}={text!r} gives {len(per_node)} node(s) but {nodes_name} lists "
            f"{len(hosts)} ({', '.join(hosts)}); both must come from the same srun step."
        )
    if sum(per_node) != count:
        raise ValueError(
            f"{name}={text!r} adds up to {sum(per_node)} task(s), but the step has {count}; "
            "both must come from the same srun step."
        )
    return per_node


def _slurm_port(environ: Mapping[str, str], port: int | None) -> int:
    if port is not None:
        return port
    job = environ.get("SLURM_JOB_ID", "0")
    slot = int(job) % SLURM_PORT_SLOTS if job.isdigit() else 0
    return SLURM_PORT_FIRST + slot * SLURM_PORTS_PER_JOB


def _check_placement(
    environ: Mapping[str, str], rank: int, placed: list[tuple[str, int]], hosts: list[str]
) -> None:
    """This task runs where block placement puts its rank (SLURM says where it runs)."""
    host, local = placed[rank]
    node_id, local_id = environ.get("SLURM_NODEID"), environ.get("SLURM_LOCALID")
    here = environ.get("SLURMD_NODENAME")
    if here and here != host:
        actual = f"on {here}"
    elif node_id and node_id.isdigit() and hosts[int(node_id)] != host:
        actual = f"on node {node_id} ({hosts[int(node_id)]})"
    elif local_id and local_id.isdigit() and int(local_id) != local:
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
            outside the task count, a host name that is not `<job>-<index>`.
    """
    fix = "run the pod in an Indexed Job (loops-launch --print=kubernetes writes one)"
    index = _whole(environ, "JOB_COMPLETION_INDEX", "this pod's index in its Indexed Job", fix)
    count = _whole(
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
    if not 0 <= index < count:
        raise ValueError(
            f"JOB_COMPLETION_INDEX={index} is outside the Job's {count} pod(s) "
            f"({KUBERNETES_TASKS_VARIABLE}={count}); set {KUBERNETES_TASKS_VARIABLE} to the "
            "Job's completions."
        )
    job = environ.get(KUBERNETES_JOB_VARIABLE, "").strip()
    if not job:
        hostname = environ.get("HOSTNAME", "")
        job, dash, suffix = hostname.rpartition("-")
        if not (job and dash and suffix == str(index)):
            raise ValueError(
                f"This pod's host name {hostname!r} is not <job>-{index}, which names the "
                f"pods of an Indexed Job; set {KUBERNETES_JOB_VARIABLE} to the Job's name."
            )
    own_port = DEFAULT_KUBERNETES_PORT if port is None else port
    addresses = [f"{job}-{member}.{service}:{own_port}" for member in range(count)]
    where = f"Kubernetes ({count} pod(s))"
    return _cluster_of("kubernetes", addresses, roles(strategy, count, num_ps, where), index)


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
    """(the scheduler, how many tasks it started of this command) when it started several."""
    if "SLURM_PROCID" in environ:
        _, text = _first(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
        if text and text.isdigit() and int(text) > 1:
            return "srun", int(text)
    text = environ.get(KUBERNETES_TASKS_VARIABLE, "")
    if "JOB_COMPLETION_INDEX" in environ and text.isdigit() and int(text) > 1:
        return "the Kubernetes Job", int(text)
    return None


def find_cluster(
    strategy: str,
    source: str = "auto",
    *,
    port: int | None = None,
    num_ps: int = 0,
    environ: Mapping[str, str] | None = None,
) -> FoundCluster | None:
    """The cluster of --strategy=`strategy` from `source` (one of CLUSTER_SOURCES).

    `auto` tries TF_CONFIG, then SLURM's srun (SLURM_PROCID), then a
    Kubernetes Indexed Job (JOB_COMPLETION_INDEX). None for a one-process
    strategy.

    Raises:
        ValueError: an unknown source; a source for a one-process strategy, or
            a scheduler that started several tasks of one (each would train
            alone); no cluster found; an inconsistent environment (the
            scheduler's function names each case).
    """
    environ = os.environ if environ is None else environ
    if source not in CLUSTER_SOURCES:
        raise ValueError(f"--cluster must be one of {', '.join(CLUSTER_SOURCES)}, got {source!r}.")
    if strategy not in CLUSTER_STRATEGIES:
        _check_one_process(strategy, source, environ)
        return None
    if source == "auto":
        source = _detected_source(strategy, environ)
    if source == "slurm":
        return slurm_cluster(environ, strategy, port, num_ps)
    if source == "kubernetes":
        return kubernetes_cluster(environ, strategy, port, num_ps)
    return tf_config_cluster(environ)


def _check_one_process(strategy: str, source: str, environ: Mapping[str, str]) -> None:
    if source != "auto":
        raise ValueError(
            f"--cluster={source} says where the tasks of a multi-process strategy come from, "
            f"but --strategy={strategy} trains in one process; drop --cluster, or use "
            "--strategy=multi_worker_mirrored or parameter_server."
        )
    started = scheduler_tasks(environ)
    if started is not None:
        scheduler, count = started
        raise ValueError(
            f"{scheduler} started {count} tasks of this command, but --strategy={strategy} "
            "trains in one process, so each task would train alone on the same model_dir; "
            "use --strategy=multi_worker_mirrored (one cluster of all tasks), or start one task."
        )


def _has_tf_config(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("TF_CONFIG", "").strip())


def _detected_source(strategy: str, environ: Mapping[str, str]) -> str:
    if _has_tf_config(environ):
        return "tf_config"
    if "SLURM_PROCID" in environ:
        return "slurm"
    if "JOB_COMPLETION_INDEX" in environ:
        return "kubernetes"
    inside = (
        f" This process runs inside SLURM job {environ['SLURM_JOB_ID']} but was not started "
        "by srun (SLURM_PROCID is unset): in an sbatch script, run it as srun <command>."
        if "SLURM_JOB_ID" in environ
        else ""
    )
    raise ValueError(
        f"--strategy={strategy} runs one process per task of a cluster, but no cluster was "
        "found: TF_CONFIG is unset, and neither SLURM's srun (SLURM_PROCID) nor a Kubernetes "
        f"Indexed Job (JOB_COMPLETION_INDEX) started this process.{inside} To give a cluster, "
        f"{_HOW_TO_GIVE}; or use --strategy=mirrored on one machine."
    )


def adopt_cluster(
    strategy: str,
    source: str = "auto",
    *,
    port: int | None = None,
    num_ps: int = 0,
    environ: MutableMapping[str, str] | None = None,
) -> FoundCluster | None:
    """Finds the cluster (`find_cluster`) and makes it this process's TF_CONFIG.

    Once per process: a cluster already adopted is kept (None is returned),
    so the command line and `make_strategy` can both call this.

    Returns:
        The cluster found now, for its line; None when there is none to find
        (a one-process strategy) or it was adopted before.
    """
    environ = os.environ if environ is None else environ
    adopted = environ.get(FOUND_BY_VARIABLE) and _has_tf_config(environ)
    if strategy in CLUSTER_STRATEGIES and adopted:
        return None
    found = find_cluster(strategy, source, port=port, num_ps=num_ps, environ=environ)
    if found is None:
        return None
    if found.found_by != "tf_config":
        environ["TF_CONFIG"] = found.tf_config()
    environ[FOUND_BY_VARIABLE] = found.found_by
    return found


def peers_resolve_now(environ: Mapping[str, str] | None = None) -> bool:
    """Whether every task's host name must resolve before the tasks start.

    Not in Kubernetes: a pod's name enters the Service's DNS only once the pod
    runs, so a peer may not resolve yet; the wait for the cluster retries it.
    """
    environ = os.environ if environ is None else environ
    return environ.get(FOUND_BY_VARIABLE) != "kubernetes"


def main(argv: list[str] | None = None) -> int:
    """`python -m loops.cluster.scheduler_cluster --strategy=S [a binary's other flags]`:
    prints the cluster line and the TF_CONFIG this task would get, or the sentence (exit 1).

    It reads --strategy, --cluster, --cluster_port and --cluster_num_ps as a
    binary does and ignores the rest, so a template's command can be checked
    by running this module in the binary's place.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m loops.cluster.scheduler_cluster")
    parser.add_argument("--strategy", default="multi_worker_mirrored")
    parser.add_argument("--cluster", default="auto")
    parser.add_argument("--cluster_port", type=int)
    parser.add_argument("--cluster_num_ps", type=int, default=0)
    options, _ = parser.parse_known_args(argv)
    try:
        found = find_cluster(
            options.strategy,
            options.cluster,
            port=options.cluster_port,
            num_ps=options.cluster_num_ps,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(found.line() if found else f"--strategy={options.strategy} runs in one process")
    if found is not None:
        print(f"TF_CONFIG={found.tf_config()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
