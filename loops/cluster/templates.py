"""Writes the sbatch script and the Kubernetes manifest that run a command as a cluster of
N tasks, each finding its place with --cluster=auto (`scheduler_cluster`).

Both restart a preempted run: a task that saved and exited 42 (SIGUSR1 before
SLURM's time limit, SIGTERM when a scheduler preempts) is started again with
the same command, which continues from its last checkpoint.

Any value is safe to generate from: the command's words are quoted for the
shell (sbatch) or are JSON strings (the manifest, which kubectl reads as
JSON); the names and the image, which go where quoting cannot help (an
`#SBATCH` line, a file name, a DNS name), are checked and refused with a
sentence.
"""

from __future__ import annotations

import dataclasses
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

_LOWER = "abcdefghijklmnopqrstuvwxyz"
_ALNUM = _LOWER + _LOWER.upper() + "0123456789"


@dataclasses.dataclass(frozen=True)
class _NameRule:
    """The characters a name may hold, start and end with, and its longest length."""

    allowed: str
    start: str
    end: str
    max_length: int
    rule: str  # the same, in words, for the sentence that refuses a name

    def problem(self, value: str) -> str | None:
        """What breaks the rule in `value`, in words; None if nothing does."""
        if not value:
            return "it is empty"
        bad = next((character for character in value if character not in self.allowed), None)
        if bad is not None:
            return f"it holds {bad!r}"
        if value[0] not in self.start:
            return f"it starts with {value[0]!r}"
        if value[-1] not in self.end:
            return f"it ends with {value[-1]!r}"
        if len(value) > self.max_length:
            return f"it is {len(value)} characters long"
        return None


# A SLURM job name goes into `#SBATCH` lines, which sbatch splits at white space,
# and into the output file's name, where `%` starts a pattern and `/` a directory.
_SLURM_JOB_NAME = _NameRule(
    _ALNUM + "._+-",
    _ALNUM,
    _ALNUM + "._+-",
    128,
    "use letters, digits, '.', '_', '+' and '-', starting with a letter or digit, at most "
    "128 characters, e.g. --job_name=digits",
)
# An RFC 1123 label (and an RFC 1035 one, as a Service needs) naming the Job and the
# Service, short enough that the pods' host names `<name>-<index>` are labels too.
_KUBERNETES_NAME = _NameRule(
    _LOWER + "0123456789-",
    _LOWER,
    _LOWER + "0123456789",
    52,
    "use lowercase letters, digits and '-', starting with a letter and ending with a letter "
    "or digit, at most 52 characters, e.g. --job_name=digits",
)
# A container image reference: registry[:port]/path[:tag][@digest].
_IMAGE = _NameRule(
    _ALNUM + "._/:@-",
    _ALNUM,
    _ALNUM,
    512,
    "a reference such as registry.example.com/loops:1 holds letters, digits, '.', '_', "
    "'/', ':', '@' and '-'",
)


class TemplateValueError(ValueError):
    """A value a template cannot carry; the message names it and the fix."""


def _check(flag: str, value: str, rule: _NameRule, what: str) -> None:
    problem = rule.problem(value)
    if problem is not None:
        raise TemplateValueError(f"{flag}={value!r} cannot {what} ({problem}): {rule.rule}.")


def check_slurm_job_name(job_name: str) -> None:
    """Raises TemplateValueError unless `job_name` can go into an sbatch script as it is."""
    _check("--job_name", job_name, _SLURM_JOB_NAME, "name a SLURM job")


def check_kubernetes_values(job_name: str, image: str, port: int) -> None:
    """Raises TemplateValueError unless the manifest's names, image and port are valid."""
    _check("--job_name", job_name, _KUBERNETES_NAME, "name a Kubernetes Job and Service")
    _check("--image", image, _IMAGE, "be a container image")
    if not 1 <= port <= 65535:
        raise TemplateValueError(f"--port={port} is outside 1..65535; pick a port in range.")


def task_count(num_workers: int, num_ps: int) -> int:
    """The tasks of a cluster with `num_ps` parameter servers: a chief beside them, if any."""
    return num_workers + num_ps + (1 if num_ps else 0)


def with_cluster_flags(command: Sequence[str], num_ps: int) -> list[str]:
    """`command` with --cluster_num_ps when it needs one and does not give it."""
    given = any(word.startswith("--cluster_num_ps") for word in command)
    return [*command, f"--cluster_num_ps={num_ps}"] if num_ps and not given else list(command)


def srun_line(command: Sequence[str], num_ps: int = 0) -> str:
    """The srun line of the sbatch script: one task per node, placed in node order, each
    output line labelled with its task number, every word quoted for the shell."""
    line = shlex.join(with_cluster_flags(command, num_ps))
    return f"srun --label --distribution=block {line}"


def slurm_script(
    command: Sequence[str], num_workers: int, num_ps: int = 0, *, job_name: str = "loops"
) -> str:
    """An sbatch script that runs `command` as one srun task per node.

    SLURM sends SIGUSR1 90 s before the time limit; the tasks save and exit
    42, and the script then requeues the job, whose tasks continue. A job
    preempted by SLURM itself (SIGTERM) is requeued by SLURM (--requeue).

    Raises:
        TemplateValueError: a job name that cannot go into the script as it is.
    """
    check_slurm_job_name(job_name)
    tasks = task_count(num_workers, num_ps)
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
{srun_line(command, num_ps)}
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
    and continues from the last checkpoint. Every value is a JSON string.

    Raises:
        TemplateValueError: a name, image or port the manifest cannot carry.
    """
    check_kubernetes_values(job_name, image, port)
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
