"""Clusters whose hosts are apart: each task in a network namespace of its own, with its own
address on a private bridge (`network_hosts`). The numbers equal one process's; a pulled
link or a killed task ends every other task within a bound, with a sentence naming the lost
task and its address; the same command afterwards continues exactly."""

import json
import os
import sys
import time

import pytest
from network_hosts import ALLOW_NOT_RUN_VARIABLE, NetworkHosts, unavailable_reason

from conftest import OutputRun, checkpoint_weights, read_results
from loops.testing import relative_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("TF_CONFIG", "LOOPS_CLUSTER_FOUND_BY")
}
ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
PORT = 23456
# Enough for eval accuracy >= 0.9 with a margin (measured 0.972 at 400 steps, as in
# test_topology_restart), and to lose a host at step 2xx with steps still to run.
TRAIN_STEPS = 400
RTOL = 1e-5
# How long every other task may take to stop once one is lost (TensorFlow's
# heartbeats notice a silent host in about 10 s; a reset connection at once).
LOST_TASK_BOUND_SECONDS = 60


@pytest.fixture
def hosts_of():
    """Makes NetworkHosts(count), deleted after the test; fails when it cannot be made."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get(ALLOW_NOT_RUN_VARIABLE) == "1":
            pytest.skip(f"not run: {reason}")
        pytest.fail(
            f"cannot make hosts that are apart: {reason}. Run as root with iproute2, or set "
            f"{ALLOW_NOT_RUN_VARIABLE}=1 to report these tests as not run."
        )
    made = []

    def make(count):
        made.append(NetworkHosts(count).__enter__())
        return made[-1]

    yield make
    for hosts in made:
        hosts.__exit__()


def classifier(model_dir, digits_dir, strategy, *extra):
    return [
        sys.executable,
        "-m",
        "loops.bin.classifier",
        f"--strategy={strategy}",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        f"--train_steps={TRAIN_STEPS}",
        "--steps_per_loop=20",
        "--checkpoint_every=100",
        "--global_batch_size=64",
        *extra,
    ]


def start_workers(hosts, model_dir, digits_dir):
    """One multi_worker_mirrored task per host, TF_CONFIG naming the hosts' addresses."""
    cluster = {"worker": [f"{address}:{PORT}" for address in hosts.addresses]}
    runs = []
    for index in range(len(hosts.addresses)):
        task = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        command = classifier(model_dir, digits_dir, "multi_worker_mirrored", "--num_replicas=1")
        runs.append(OutputRun(hosts.command(index, command), dict(ENV, TF_CONFIG=json.dumps(task))))
    return runs


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, digits_dir):
    """The model_dir of the same training in one process with 2 replicas."""
    model_dir = str(tmp_path_factory.mktemp("one_process"))
    OutputRun(classifier(model_dir, digits_dir, "mirrored", "--num_replicas=2"), ENV).succeed()
    return model_dir


def assert_same_numbers(model_dir, reference_dir):
    got, expected = read_results(model_dir), read_results(reference_dir)
    assert got["global_step"] == TRAIN_STEPS and got["num_replicas"] == 2
    assert got["train"]["loss"] == pytest.approx(expected["train"]["loss"], rel=RTOL)
    assert got["eval"]["accuracy"] == expected["eval"]["accuracy"] >= 0.9
    weights, reference = checkpoint_weights(model_dir), checkpoint_weights(reference_dir)
    assert sorted(weights) == sorted(reference) and len(reference) >= 10
    difference = max(relative_error(weights[name], reference[name]) for name in reference)
    print(f"largest relative weight difference to one process: {difference:.2g}")
    assert difference <= RTOL


def test_two_hosts_apart_give_one_processs_numbers(hosts_of, tmp_path, digits_dir, one_process):
    hosts = hosts_of(2)
    runs = start_workers(hosts, str(tmp_path), digits_dir)
    for index, run in enumerate(runs):
        run.succeed(timeout=300)
        line = f"cluster: TF_CONFIG, 2 workers, this task worker {index} at "
        assert line + f"{hosts.addresses[index]}:{PORT}" in run.lines
    assert_same_numbers(str(tmp_path), one_process)


@pytest.mark.parametrize("fault", ["link cut", "process killed"])
def test_a_lost_host_stops_every_task_with_its_name_and_the_same_command_continues(
    fault, hosts_of, tmp_path, digits_dir, one_process
):
    hosts, model_dir = hosts_of(2), str(tmp_path)
    runs = start_workers(hosts, model_dir, digits_dir)
    runs[0].wait_for(rf"step (2\d\d)/{TRAIN_STEPS} \|", timeout=180)
    lost_at = time.monotonic()
    if fault == "link cut":
        hosts.cut(1)
    else:
        runs[1].process.kill()
    survivors = runs if fault == "link cut" else runs[:1]
    for run in survivors:
        code = run.finish(timeout=LOST_TASK_BOUND_SECONDS + 30)
        seconds = time.monotonic() - lost_at
        print(f"{fault}: a task exited {code} {seconds:.1f} s after the loss")
        assert seconds <= LOST_TASK_BOUND_SECONDS
        assert code == 1, run.output[-3000:]
        assert "Traceback" not in run.output, run.output[-3000:]
    lost_line = runs[0].lines[-1]
    assert lost_line.startswith(f"error: worker_0 lost worker_1 at {hosts.addresses[1]}:{PORT}: ")
    assert (
        "Start every task again with the same command once its host is reachable, and the "
        "run continues from that checkpoint." in lost_line
    )
    if fault == "link cut":
        # The host that was cut off lost the chief, where the coordination service runs.
        assert (
            runs[1]
            .lines[-1]
            .startswith(f"error: worker_1 lost worker_0 at {hosts.addresses[0]}:{PORT}: ")
        )
        hosts.mend(1)
    for run in start_workers(hosts, model_dir, digits_dir):
        run.succeed(timeout=300)
    assert_same_numbers(model_dir, one_process)


def test_a_parameter_server_job_on_three_hosts_found_from_srun(hosts_of, tmp_path, digits_dir):
    """Chief, ps and worker on hosts apart, each finding its place from SLURM's environment."""
    hosts, model_dir, steps = hosts_of(3), str(tmp_path), 200
    first, _, _ = hosts.addresses[0].rpartition(".")
    node_list = f"{first}.[1-3]"  # SLURM's compressed form of the three hosts' addresses
    runs = []
    for rank, address in enumerate(hosts.addresses):
        srun = dict(
            SLURM_JOB_ID="5",
            SLURM_PROCID=str(rank),
            SLURM_STEP_NUM_TASKS="3",
            SLURM_STEP_NODELIST=node_list,
            SLURM_STEP_TASKS_PER_NODE="1(x3)",
            SLURM_NODEID=str(rank),
            SLURM_LOCALID="0",
            SLURMD_NODENAME=address,
        )
        command = [
            *classifier(model_dir, digits_dir, "parameter_server", "--num_replicas=1"),
            f"--train_steps={steps}",
            f"--cluster_port={PORT}",
            "--cluster_num_ps=1",
        ]
        runs.append(OutputRun(hosts.command(rank, command), dict(ENV, **srun)))
    chief, ps, worker = runs
    try:
        chief.succeed(timeout=300)
    finally:
        for server in (ps, worker):
            server.process.kill()
            server.finish()
    for run, task, address in zip(runs, ("chief 0", "ps 0", "worker 0"), hosts.addresses):
        line = f"cluster: slurm, 1 chief, 1 ps, 1 worker, this task {task} at {address}:{PORT}"
        assert line in run.lines, run.output[-2000:]
    assert f"worker_0 serving at grpc://{hosts.addresses[2]}:{PORT} until stopped" in worker.output
    got = read_results(model_dir)
    assert got["strategy"] == "parameter_server" and got["global_step"] == steps
    assert got["eval"]["accuracy"] >= 0.9
    # The variables live on the ps host: the chief's checkpoint has a shard from each.
    assert f"ckpt-{steps}.data-00001-of-00002" in os.listdir(os.path.join(model_dir, "checkpoints"))
