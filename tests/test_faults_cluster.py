"""Cluster fault trials (issue 31), run the way a user runs a binary.

Each damaged TF_CONFIG, a missing cluster, a SLURM batch script's shell taken for a
task, each malformed SLURM or Kubernetes environment, a port taken by another program,
a foreign program on a peer's port, a server that speaks HTTP/2 but is no
task, and SIGTERM in the wait and inside TensorFlow's start: each run ends
within a bound (some hung until SIGKILL before) with its sentence and exit
code, prints no traceback, and leaves the model_dir as it was.
"""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, SUBPROCESS_ENV
from loops.cluster import cluster_config, cluster_wait, launch, strategies, templates
from loops.vocabulary import exit_codes

# Every case ended within this many seconds; the hangs it guards against were endless.
HANG_BOUND_SECONDS = 60
ENV = {
    name: value
    for name, value in SUBPROCESS_ENV.items()
    if name not in ("TF_CONFIG", strategies.CLUSTER_TIMEOUT_VARIABLE)
}
KEPT = "a file of an earlier run\n"
# `python -X importtime` lists each module it imports on stderr. NumPy counts too: its BLAS
# threads, started at its import, would take a SIGTERM in TensorFlow's start that only the
# start-up watchdog can act on (a regression of 5.2.0's run_config, caught by
# test_sigterm_inside_tensorflows_start_exits_42).
IMPORTS_NUMPY_OR_TENSORFLOW = re.compile(r"\|\s+(tensorflow|numpy)$", re.MULTILINE)


def tf_config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def addresses(count):
    return [f"127.0.0.1:{port}" for port in launch.free_ports(count)]


def port_of(address):
    return int(address.rsplit(":", 1)[1])


@pytest.fixture
def model_dir(tmp_path):
    """A model_dir holding one file, which every case must leave as it was."""
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / "kept.txt").write_text(KEPT)
    yield str(directory)
    assert os.listdir(directory) == ["kept.txt"]
    assert (directory / "kept.txt").read_text() == KEPT


def start_binary(model_dir, config, strategy="multi_worker_mirrored", *python, **env):
    environment = dict(ENV, **env)
    if config is not None:
        environment["TF_CONFIG"] = config
    return subprocess.Popen(
        # A process group of its own, for the cases that signal the whole group.
        start_new_session=True,
        args=[sys.executable, *python, "-m", "loops.bin.classifier", f"--strategy={strategy}"]
        + [f"--model_dir={model_dir}", f"--data_dir={model_dir}-data", "--num_replicas=1"],
        env=environment,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(task, started):
    """(exit code, stderr, seconds since `started`) of `task`, killed past the bound."""
    try:
        _, stderr = task.communicate(timeout=HANG_BOUND_SECONDS)
    except subprocess.TimeoutExpired:
        task.kill()
        _, stderr = task.communicate()
        pytest.fail(f"still running after {HANG_BOUND_SECONDS} s:\n{stderr[-3000:]}")
    seconds = time.monotonic() - started
    assert "Traceback" not in stderr, stderr[-3000:]
    return task.returncode, stderr, seconds


# ---- Refused before TensorFlow loads. ----

WORKERS = "127.0.0.1:2222", "127.0.0.1:2223"
REFUSED = {
    "no TF_CONFIG (multi_worker_mirrored)": (
        "multi_worker_mirrored",
        None,
        "error: --strategy=multi_worker_mirrored runs one process per task of a cluster, but no "
        "cluster was found: TF_CONFIG is unset, and neither SLURM's srun (SLURM_STEP_ID) nor a "
        "Kubernetes Indexed Job (JOB_COMPLETION_INDEX) started this process. To give a cluster, "
        "start the tasks with srun, in a Kubernetes Indexed Job (loops-launch --print=slurm or "
        "--print=kubernetes writes either), with loops-launch --num_workers=N on one machine, or "
        "set TF_CONFIG on every task (like ",
        "; or use --strategy=mirrored on one machine.",
    ),
    "no TF_CONFIG (parameter_server)": (
        "parameter_server",
        None,
        "error: --strategy=parameter_server runs one process per task of a cluster, but no "
        "cluster was found: TF_CONFIG is unset, and neither SLURM's srun",
        "; or use --strategy=mirrored on one machine.",
    ),
    "a TF_CONFIG without a cluster": (
        "multi_worker_mirrored",
        json.dumps({"task": {"type": "worker", "index": 0}}),
        "no cluster was found: TF_CONFIG is {'task': {'type': 'worker', 'index': 0}}. Set "
        "TF_CONFIG on every task",
        "",
    ),
    "TF_CONFIG not JSON": (
        "multi_worker_mirrored",
        "{cluster: oops",
        "error: TF_CONFIG is not valid JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)): '{cluster: oops'. Set it to {\"cluster\": ",
        "or unset it.",
    ),
    "TF_CONFIG a list": (
        "multi_worker_mirrored",
        "[1]",
        "error: TF_CONFIG is '[1]', a JSON list, not an object; set it to {\"cluster\": ",
        "",
    ),
    "an address that is a number": (
        "multi_worker_mirrored",
        tf_config({"worker": [WORKERS[0], 2223]}),
        'error: TF_CONFIG gives worker_1 the address 2223, which is not a "host:port" string; '
        'write it in quotes like "10.0.0.2:2222" (the same cluster on every task).',
        "",
    ),
    "an address without a port": (
        "parameter_server",
        tf_config({"chief": [WORKERS[0]], "worker": ["127.0.0.1"], "ps": [WORKERS[1]]}, "chief"),
        "error: TF_CONFIG gives worker_0 the address '127.0.0.1', which is not host:port; write "
        "it like 10.0.0.2:2222",
        "",
    ),
    "a cluster that is a list": (
        "multi_worker_mirrored",
        json.dumps({"cluster": list(WORKERS), "task": {"type": "worker", "index": 0}}),
        "error: TF_CONFIG's cluster is ['127.0.0.1:2222', '127.0.0.1:2223'], not an object of "
        'task types; write it like "cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}.',
        "",
    ),
    "a task type's addresses that are a string": (
        "multi_worker_mirrored",
        tf_config({"worker": WORKERS[0]}),
        "error: TF_CONFIG's cluster gives 'worker' the tasks '127.0.0.1:2222', not a list of "
        'addresses; write it like "worker": ["10.0.0.1:2222"].',
        "",
    ),
    "a task type not in the cluster": (
        "multi_worker_mirrored",
        tf_config({"worker": list(WORKERS)}, "chief"),
        "error: TF_CONFIG names this task chief_0, but its cluster has no 'chief' tasks (it has "
        "'worker'); give the task a type of its cluster in TF_CONFIG's \"task\", or add it to "
        "the cluster on every task.",
        "",
    ),
    "a task index not in the cluster": (
        "multi_worker_mirrored",
        tf_config({"worker": list(WORKERS)}, index=2),
        "error: TF_CONFIG names this task worker_2, but its cluster has 2 worker task(s) "
        '(indices [0, 1]); give each task its own index among those in TF_CONFIG\'s "task".',
        "",
    ),
    "no task": (
        "multi_worker_mirrored",
        json.dumps({"cluster": {"worker": list(WORKERS)}}),
        'error: TF_CONFIG has no "task"; name this process\'s task in it like "task": '
        '{"type": "worker", "index": 0}, a type and index of its cluster.',
        "",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_or_missing_cluster_is_refused_before_tensorflow_loads(case, model_dir):
    strategy, config, sentence, ending = REFUSED[case]
    started = time.monotonic()
    code, stderr, seconds = finish(
        start_binary(model_dir, config, strategy, "-X", "importtime"), started
    )
    print(f"{case}: exit {code} after {seconds:.2f} s")
    assert code == 1
    assert sentence in stderr
    assert ending in stderr
    assert not IMPORTS_NUMPY_OR_TENSORFLOW.search(stderr)


# An sbatch script's own shell as SLURM 22.05 gives it (job 4321 on gpu07 and gpu08, one
# task each), and the environment srun gives task 0 of the job's step 0.
BATCH_SHELL = {
    "ENVIRONMENT": "BATCH",
    "SLURM_CLUSTER_NAME": "hpc",
    "SLURM_JOBID": "4321",
    "SLURM_JOB_ID": "4321",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "gpu[07-08]",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_SUBMIT_DIR": "/home/alice",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURMD_NODENAME": "gpu07",
}
SRUN_TASK_0 = dict(
    BATCH_SHELL,
    SLURM_STEPID="0",
    SLURM_STEP_ID="0",
    SLURM_STEP_LAUNCHER_PORT="42137",
    SLURM_STEP_NODELIST="gpu[07-08]",
    SLURM_STEP_NUM_NODES="2",
    SLURM_STEP_NUM_TASKS="2",
    SLURM_STEP_TASKS_PER_NODE="1(x2)",
)
POD_0 = {
    "JOB_COMPLETION_INDEX": "0",
    "HOSTNAME": "digits-0",
    "LOOPS_CLUSTER_TASKS": "2",
    "LOOPS_CLUSTER_SERVICE": "digits",
    "LOOPS_CLUSTER_JOB": "digits",
}
FROM_SCHEDULER = {
    "SLURM_NODEID beyond the node list": (
        dict(SRUN_TASK_0, SLURM_NODEID="2"),
        "error: SLURM_NODEID=2 is outside the 2 node(s) of SLURM_STEP_NODELIST='gpu[07-08]' "
        "(numbered from 0); both must come from the same srun step: run the command under srun "
        "(in an sbatch script: srun <command>).\n",
    ),
    "a node list range of 10^12 names": (
        dict(SRUN_TASK_0, SLURM_STEP_NODELIST="gpu[1-1000000000000]"),
        "error: SLURM's node list SLURM_STEP_NODELIST='gpu[1-1000000000000]' cannot be read: it "
        "names 1000000000000 nodes, more than the 100000 a cluster here may have. It should "
        "look like gpu[01-04,07],cpu3; run the task under srun, which sets it.\n",
    ),
    "SLURM_STEP_TASKS_PER_NODE=1(x1000000000)": (
        dict(SRUN_TASK_0, SLURM_STEP_TASKS_PER_NODE="1(x1000000000)"),
        "error: SLURM's tasks per node SLURM_STEP_TASKS_PER_NODE='1(x1000000000)' gives "
        "1000000000 task(s) on 1000000000 node(s), more than the 100000 a cluster here may "
        "have; run the task under srun, which sets it.\n",
    ),
    "SLURM_PROCID='²'": (
        dict(SRUN_TASK_0, SLURM_PROCID="²"),
        "error: SLURM_PROCID (this task's rank) is '²', not a whole number in the digits 0-9; "
        "run the command under srun (in an sbatch script: srun <command>).\n",
    ),
    "a Kubernetes task count of 10^9": (
        dict(POD_0, LOOPS_CLUSTER_TASKS="1000000000"),
        "error: LOOPS_CLUSTER_TASKS=1000000000 (the Job's completions) is not a task count from "
        "1 to 100000; set it in the pod's environment to the Job's completions; run the pod in "
        "an Indexed Job (loops-launch --print=kubernetes writes one).\n",
    ),
    "a Kubernetes Service name with a space": (
        dict(POD_0, LOOPS_CLUSTER_SERVICE="digits workers"),
        "error: LOOPS_CLUSTER_SERVICE='digits workers' (the headless Service the Job's pods "
        "name as their subdomain) is not a DNS name, so no address built from it would "
        "resolve: each part between dots must be 1-63 lower-case letters, digits and '-', "
        "starting and ending with a letter or digit (RFC 1123); set it to that Service's name.\n",
    ),
    "a Kubernetes Job name with '/' and ':'": (
        dict(POD_0, LOOPS_CLUSTER_JOB="team/digits:7"),
        "error: LOOPS_CLUSTER_JOB='team/digits:7' (the Indexed Job's name) is not a DNS name, "
        "so no address built from it would resolve:",
    ),
}


@pytest.mark.parametrize("case", list(FROM_SCHEDULER))
def test_a_malformed_scheduler_environment_is_a_sentence_before_tensorflow_loads(case, model_dir):
    # Each was a raw IndexError or MemoryError, or an address that could never resolve.
    environment, sentence = FROM_SCHEDULER[case]
    started = time.monotonic()
    task = start_binary(model_dir, None, "multi_worker_mirrored", "-X", "importtime", **environment)
    code, stderr, seconds = finish(task, started)
    print(f"{case}: exit {code} after {seconds:.2f} s")
    assert code == 1
    assert sentence in stderr
    assert seconds < 10
    assert not IMPORTS_NUMPY_OR_TENSORFLOW.search(stderr)


def test_a_cluster_strategy_in_a_batch_scripts_shell_is_told_to_use_srun(model_dir):
    # Taken for task 0, it printed "this task worker 0 at gpu07:20080" and waited 600 s.
    started = time.monotonic()
    code, stderr, seconds = finish(start_binary(model_dir, None, **BATCH_SHELL), started)
    assert code == 1
    assert seconds < 10
    command = ["python3", "-m", "loops.bin.classifier", "--strategy=multi_worker_mirrored"]
    command += [f"--model_dir={model_dir}", f"--data_dir={model_dir}-data", "--num_replicas=1"]
    script = templates.slurm_script(command, 2)
    (srun_line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert stderr.endswith(
        "error: --strategy=multi_worker_mirrored runs one process per task of a cluster, and "
        "this process is the shell of SLURM job 4321 (its sbatch script or salloc), not a task "
        "of an srun step (SLURM_JOB_ID is set, SLURM_STEP_ID is not): taken for a task, it "
        "would wait for the others for ever. Start the command with srun in the sbatch script, "
        f"one task per node, as loops-launch --print=slurm writes it: {srun_line}\n"
    )


def test_an_own_port_taken_by_another_program_is_refused_before_tensorflow_loads(model_dir):
    cluster = addresses(2)
    with socket.create_server(("127.0.0.1", port_of(cluster[1]))):
        started = time.monotonic()
        code, stderr, _ = finish(
            start_binary(
                model_dir,
                tf_config({"worker": cluster}, index=1),
                "multi_worker_mirrored",
                "-X",
                "importtime",
            ),
            started,
        )
    assert code == 1
    assert (
        f"error: Port {port_of(cluster[1])} of worker_1 ({cluster[1]} in TF_CONFIG) is taken by "
        "another process; stop it (an earlier run's task?) or give this task a free port in "
        "TF_CONFIG on every task.\n"
    ) in stderr
    assert not IMPORTS_NUMPY_OR_TENSORFLOW.search(stderr)


def test_an_own_port_that_needs_privileges_is_named(monkeypatch):
    # Refused to anyone but root; the refusal is imitated so that the test runs as anyone.
    def refuse(self, address):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(ValueError) as raised:
        cluster_config.check_port_free("worker_0", "127.0.0.1:80")
    assert str(raised.value) == (
        "Port 80 of worker_0 (127.0.0.1:80 in TF_CONFIG) cannot be opened by this user "
        "(Permission denied): ports below 1024 need privileges. Give the task a port above "
        "1023 in TF_CONFIG on every task."
    )


# ---- A peer's port answered by something that is not a task of this cluster. ----


class Impostor:
    """A program on a peer's port: `silent` accepts and says nothing, `junk` sends a line that
    is not HTTP/2 and hangs up, `http2` answers like a gRPC server and then says nothing."""

    def __init__(self, address, behaviour):
        self.server = socket.create_server(("127.0.0.1", port_of(address)))
        self.behaviour = behaviour
        self.connections = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return  # closed
            self.connections.append(connection)
            if self.behaviour == "junk":
                connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                connection.close()
            elif self.behaviour == "http2":
                connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS

    def close(self):
        self.server.close()
        for connection in self.connections:
            connection.close()


@pytest.mark.parametrize("behaviour", ["silent", "junk"])
def test_a_foreign_program_on_a_peers_port_is_named_as_such(behaviour, model_dir):
    cluster = addresses(2)
    impostor = Impostor(cluster[1], behaviour)
    try:
        started = time.monotonic()
        code, stderr, seconds = finish(
            start_binary(model_dir, tf_config({"worker": cluster})), started
        )
    finally:
        impostor.close()
    print(f"{behaviour}: exit {code} after {seconds:.2f} s")
    assert code == 1
    assert (
        f"worker_0 cannot start its cluster: port {port_of(cluster[1])} on 127.0.0.1 (worker_1's "
        "address in TF_CONFIG) answers but is not a TensorFlow server of this cluster (it "
        "accepts connections but does not speak gRPC): another program listens there. Stop "
        "that program, or give worker_1 a free port in TF_CONFIG on every task."
    ) in stderr
    assert seconds >= cluster_wait.FOREIGN_GRACE_SECONDS  # not named at its first answer


def test_tensorflows_own_start_is_bounded(model_dir):
    # The impostor answers like a gRPC server, so the wait passes; TensorFlow's
    # start then waits on it for ever, and only the watchdog ends it.
    cluster = addresses(2)
    impostor = Impostor(cluster[0], "http2")
    try:
        started = time.monotonic()
        code, stderr, seconds = finish(
            start_binary(
                model_dir,
                tf_config({"worker": cluster}, index=1),
                **{strategies.CLUSTER_TIMEOUT_VARIABLE: "3"},
            ),
            started,
        )
    finally:
        impostor.close()
    print(f"exit {code} after {seconds:.2f} s")
    assert code == 1
    assert (
        "worker_1: TensorFlow's cluster start-up did not finish within 3 s after every task of "
        "TF_CONFIG answered; exiting with code 1. A task stopped meanwhile, or an address of "
        "TF_CONFIG reaches a server that is not a task of this cluster: check that every task "
        "runs with the same TF_CONFIG cluster, then rerun (or set "
        "LOOPS_CLUSTER_TIMEOUT_SECONDS higher).\n"
    ) in stderr
    assert len(impostor.connections) >= 2  # the wait's probe, then TensorFlow


# ---- SIGTERM during start-up. ----

PREEMPTED_LINE = (
    "{task} received SIGTERM while starting its cluster (waiting for its peers or in "
    "TensorFlow's start-up), before any work; exiting with code 42 (preempted): rerun the "
    "same command to start again.\n"
)


def sigterm_when(task, ready, timeout=HANG_BOUND_SECONDS, *, group=False):
    """Sends SIGTERM to `task` (or its whole process group) once `ready()` holds;
    returns when it was sent."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert task.poll() is None, task.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the moment to signal never came"
        time.sleep(0.05)
    if group:
        os.killpg(task.pid, signal.SIGTERM)  # as a scheduler that stops every process may
    else:
        task.send_signal(signal.SIGTERM)
    return time.monotonic()


def test_sigterm_while_waiting_for_peers_exits_42(model_dir):
    cluster = addresses(2)
    task = start_binary(model_dir, tf_config({"worker": cluster}))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(task.stderr.readline, "")))
    reader.start()
    sent = sigterm_when(task, lambda: any("waiting up to" in line for line in lines))
    code = task.wait(timeout=HANG_BOUND_SECONDS)
    reader.join()
    print(f"exited {time.monotonic() - sent:.2f} s after SIGTERM")
    assert code == exit_codes.PREEMPTED
    assert PREEMPTED_LINE.format(task="worker_0") in lines


@pytest.mark.parametrize("group", [False, True], ids=["to the task", "to its process group"])
def test_sigterm_inside_tensorflows_start_exits_42(model_dir, group):
    cluster = addresses(2)
    impostor = Impostor(cluster[0], "http2")
    try:
        task = start_binary(model_dir, tf_config({"worker": cluster}, index=1))
        # The wait's probe is the first connection; TensorFlow's start makes the second.
        sent = sigterm_when(task, lambda: len(impostor.connections) >= 2, group=group)
        code, stderr, _ = finish(task, sent)
    finally:
        impostor.close()
    print(f"exited {time.monotonic() - sent:.2f} s after SIGTERM")
    assert code == exit_codes.PREEMPTED
    assert PREEMPTED_LINE.format(task="worker_1") in stderr


# ---- Local clusters and the network. ----

# Starts TensorFlow's server on a 127.0.0.1 address, then prints the local
# addresses the kernel lists as listening on its port (/proc/net/tcp and tcp6).
LISTEN_ADDRESSES = """
import sys
import tensorflow as tf
port = int(sys.argv[1])
cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]})
tf.distribute.Server(cluster, job_name="worker", task_index=0, start=True)
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as rows:
        for row in list(rows)[1:]:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                print(address)
"""


def test_tensorflows_server_listens_on_every_interface_as_the_launcher_says():
    # TensorFlow 2.21 binds 0.0.0.0:PORT whatever host TF_CONFIG gives, so the
    # launcher warns (launch.OPEN_SERVERS_NOTE). Should a later TensorFlow bind
    # the given host, this fails: then bind loops-launch clusters to 127.0.0.1.
    (port,) = launch.free_ports(1)
    done = subprocess.run(
        [sys.executable, "-c", LISTEN_ADDRESSES, str(port)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=HANG_BOUND_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    listening = done.stdout.split()
    assert listening, done.stderr[-3000:]
    # All zeros: the wildcard address (0.0.0.0 or ::), every interface.
    assert all(set(address) == {"0"} for address in listening), listening
