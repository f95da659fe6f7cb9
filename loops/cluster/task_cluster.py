"""Finds this task's cluster (TF_CONFIG, an srun step, a Kubernetes Indexed Job) and adopts
it as the TF_CONFIG TensorFlow reads, or says why there is none, before TensorFlow loads.

A module beside `scheduler_cluster` (which reads each scheduler's variables)
because the srun line a batch script's shell is told comes from `templates`,
which imports `scheduler_cluster`: that one cannot import it back.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence

from loops.cluster import templates
from loops.cluster.environment_values import is_whole_number, shown
from loops.cluster.scheduler_cluster import (
    FOUND_BY_VARIABLE,
    FoundCluster,
    in_srun_step,
    kubernetes_cluster,
    scheduler_tasks,
    slurm_cluster,
    tf_config_cluster,
)
from loops.vocabulary.choices import CLUSTER_SOURCES, CLUSTER_STRATEGIES

_HOW_TO_GIVE = (
    "start the tasks with srun, in a Kubernetes Indexed Job (loops-launch --print=slurm or "
    "--print=kubernetes writes either), with loops-launch --num_workers=N on one machine, or "
    'set TF_CONFIG on every task (like {"cluster": {"worker": ["host:port", ...]}, "task": '
    '{"type": "worker", "index": 0}})'
)


def find_cluster(
    strategy: str,
    source: str = "auto",
    *,
    port: int | None = None,
    num_ps: int = 0,
    environ: Mapping[str, str] | None = None,
    command: Sequence[str] | None = None,
) -> FoundCluster | None:
    """The cluster of --strategy=`strategy` from `source` (one of CLUSTER_SOURCES).

    `auto` tries TF_CONFIG, then an srun step (its SLURM_STEP_* variables),
    then a Kubernetes Indexed Job (JOB_COMPLETION_INDEX). None for a
    one-process strategy, which also just runs in an sbatch script's shell.
    `command`: this process's command (None: `this_command()`), for the srun
    line a batch script's shell is told.

    Raises:
        ValueError: an unknown source; a source for a one-process strategy, or
            a scheduler that started several tasks of one (each would train
            alone); a cluster strategy in a SLURM job outside any srun step;
            no cluster found; a malformed or inconsistent environment (the
            scheduler's function in `scheduler_cluster` names each case).
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
        if not in_srun_step(environ):
            command = this_command() if command is None else command
            raise ValueError(_outside_srun_step(strategy, environ, command, num_ps))
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
    # A SLURM job's own shell is "slurm" too, to be told to start the command with srun.
    if in_srun_step(environ) or "SLURM_JOB_ID" in environ:
        return "slurm"
    if "JOB_COMPLETION_INDEX" in environ:
        return "kubernetes"
    raise ValueError(
        f"--strategy={strategy} runs one process per task of a cluster, but no cluster was "
        "found: TF_CONFIG is unset, and neither SLURM's srun (SLURM_STEP_ID) nor a Kubernetes "
        f"Indexed Job (JOB_COMPLETION_INDEX) started this process. To give a cluster, "
        f"{_HOW_TO_GIVE}; or use --strategy=mirrored on one machine."
    )


def _outside_srun_step(
    strategy: str, environ: Mapping[str, str], command: Sequence[str], num_ps: int
) -> str:
    """Why a SLURM job's own shell (sbatch's script, salloc's) is no task of a cluster."""
    script = templates.slurm_script(command, 1, num_ps)
    srun_line = next(line for line in script.splitlines() if line.startswith("srun "))
    job = environ.get("SLURM_JOB_ID")
    if job is None:
        where = "SLURM did not start this process (SLURM_JOB_ID and SLURM_STEP_ID are unset)"
    else:
        job = job if is_whole_number(job) else shown(job)
        where = (
            f"this process is the shell of SLURM job {job} (its sbatch script or salloc), not "
            "a task of an srun step (SLURM_JOB_ID is set, SLURM_STEP_ID is not): taken for a "
            "task, it would wait for the others for ever"
        )
    return (
        f"--strategy={strategy} runs one process per task of a cluster, and {where}. Start "
        "the command with srun in the sbatch script, one task per node, as loops-launch "
        f"--print=slurm writes it: {srun_line}"
    )


def this_command() -> list[str]:
    """This process's command as it would be typed again: `python3 -m MODULE ARGS` for a
    module run with -m (as `loops-launch` templates write modules), else `PROGRAM ARGS`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return ["python3", "-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    return [os.path.basename(sys.argv[0]), *sys.argv[1:]]


def adopt_cluster(
    strategy: str,
    source: str = "auto",
    *,
    port: int | None = None,
    num_ps: int = 0,
    environ: MutableMapping[str, str] | None = None,
    command: Sequence[str] | None = None,
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
    found = find_cluster(
        strategy, source, port=port, num_ps=num_ps, environ=environ, command=command
    )
    if found is None:
        return None
    if found.found_by != "tf_config":
        environ["TF_CONFIG"] = found.tf_config()
    environ[FOUND_BY_VARIABLE] = found.found_by
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m loops.cluster.task_cluster --strategy=S [a binary's other flags]`:
    prints the cluster line and the TF_CONFIG this task would get, or the sentence (exit 1).

    It reads --strategy, --cluster, --cluster_port and --cluster_num_ps as a
    binary does and ignores the rest, so a template's command can be checked
    by running this module in the binary's place.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m loops.cluster.task_cluster")
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
