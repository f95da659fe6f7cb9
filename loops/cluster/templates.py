"""Writes the sbatch script and the Kubernetes manifest that run a command as a cluster of
N tasks, each finding its place with --cluster=auto (`scheduler_cluster`).

Both restart a preempted run: a task that saved and exited 42 (SIGUSR1 before
SLURM's time limit, SIGTERM when a scheduler preempts) is started again with
the same command, which continues from its last checkpoint.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

from loops.cluster.scheduler_cluster import (
    DEFAULT_KUBERNETES_PORT,
    KUBERNETES_JOB_VARIABLE,
    KUBERNETES_SERVICE_VARIABLE,
    KUBERNETES_TASKS_VARIABLE,
)
from loops.vocabulary import exit_codes

TEMPLATES = ("slurm", "kubernetes")
# Seconds before SLURM's time limit that a task gets SIGUSR1: an inner loop, a
# checkpoint save and the exit fit in it for the bundled examples.
SLURM_SIGNAL_SECONDS = 90
# Seconds between Kubernetes' SIGTERM and its SIGKILL: the same allowance.
KUBERNETES_GRACE_SECONDS = 90
# Other failures a Kubernetes Job retries before it fails.
KUBERNETES_BACKOFF_LIMIT = 3
# The label Kubernetes puts on every pod of a Job (1.27 and later).
KUBERNETES_JOB_LABEL = "batch.kubernetes.io/job-name"


def task_count(num_workers: int, num_ps: int) -> int:
    """The tasks of a cluster with `num_ps` parameter servers: a chief beside them, if any."""
    return num_workers + num_ps + (1 if num_ps else 0)


def with_cluster_flags(command: Sequence[str], num_ps: int) -> list[str]:
    """`command` with --cluster_num_ps when it needs one and does not give it."""
    given = any(word.startswith("--cluster_num_ps") for word in command)
    return [*command, f"--cluster_num_ps={num_ps}"] if num_ps and not given else list(command)


def slurm_script(
    command: Sequence[str], num_workers: int, num_ps: int = 0, *, job_name: str = "loops"
) -> str:
    """An sbatch script that runs `command` as one srun task per node.

    SLURM sends SIGUSR1 90 s before the time limit; the tasks save and exit
    42, and the script then requeues the job, whose tasks continue. A job
    preempted by SLURM itself (SIGTERM) is requeued by SLURM (--requeue).
    """
    tasks = task_count(num_workers, num_ps)
    line = shlex.join(with_cluster_flags(command, num_ps))
    return f"""#!/bin/bash
# Written by loops-launch --print=slurm: {tasks} task(s), one per node.
#SBATCH --job-name={job_name}
#SBATCH --nodes={tasks}
#SBATCH --ntasks-per-node=1
#SBATCH --signal=USR1@{SLURM_SIGNAL_SECONDS}
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={job_name}-%j.out
# Add the partition, the time limit and the GPUs per node your cluster needs;
# the run's --model_dir must be on storage every node mounts.

# Each task finds its place from srun's environment (--cluster=auto).
srun --distribution=block {line}
code=$?
if [ "$code" -eq {exit_codes.PREEMPTED} ]; then
    # Preempted: every completed step is saved; the same command continues.
    echo "preempted (exit {exit_codes.PREEMPTED}): requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$code"
"""


def kubernetes_manifest(
    command: Sequence[str],
    num_workers: int,
    num_ps: int = 0,
    *,
    job_name: str = "loops",
    image: str,
    port: int = DEFAULT_KUBERNETES_PORT,
) -> str:
    """A Kubernetes List (JSON) of a headless Service and an Indexed Job running `command`.

    Pod i is `<job>-<i>.<job>` (the Service of the same name is its
    subdomain). A pod that exits 42 after a preemption, or is disrupted (its
    node drained or preempted), is replaced without counting as a failure,
    and continues from the last checkpoint.
    """
    tasks = task_count(num_workers, num_ps)
    environment = {
        KUBERNETES_TASKS_VARIABLE: str(tasks),
        KUBERNETES_SERVICE_VARIABLE: job_name,
        KUBERNETES_JOB_VARIABLE: job_name,
        "PYTHONUNBUFFERED": "1",
    }
    container = {
        "name": "task",
        "image": image,
        "command": with_cluster_flags(command, num_ps),
        "env": [{"name": name, "value": value} for name, value in environment.items()],
        "ports": [{"containerPort": port}],
    }
    items = [_headless_service(job_name, port), _indexed_job(job_name, tasks, container)]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2)


def _headless_service(name: str, port: int) -> dict:
    """The Service whose DNS names the Job's pods `<job>-<index>.<name>`."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            # Peers must find a pod before it is ready: they start together.
            "publishNotReadyAddresses": True,
            "selector": {KUBERNETES_JOB_LABEL: name},
            "ports": [{"name": "tensorflow", "port": port}],
        },
    }


def _indexed_job(name: str, tasks: int, container: dict) -> dict:
    """The Job of `tasks` pods that replaces a preempted pod without counting a failure."""
    preempted = {"containerName": "task", "operator": "In", "values": [exit_codes.PREEMPTED]}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": tasks,
            "parallelism": tasks,
            "backoffLimit": KUBERNETES_BACKOFF_LIMIT,
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onExitCodes": preempted},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {
                "spec": {
                    "subdomain": name,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": KUBERNETES_GRACE_SECONDS,
                    "containers": [container],
                }
            },
        },
    }
