"""The cluster a task finds from its scheduler's environment: TF_CONFIG, an srun step, a
Kubernetes Indexed Job, in that order of trust; every inconsistency and every malformed
value a sentence, found in bounded time and memory."""

import json
import os
import subprocess
import sys
import time

import pytest

from loops.cluster import cluster_config, scheduler_cluster, templates
from loops.cluster.scheduler_cluster import expand_hostlist, expand_tasks_per_node
from loops.cluster.task_cluster import adopt_cluster, find_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("cpu3", ["cpu3"]),
        ("gpu[01-04,07],cpu3", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b[3],c-d[1,5]", ["a", "b3", "c-d1", "c-d5"]),
        ("node-[001-002].cluster", ["node-001.cluster", "node-002.cluster"]),
    ],
)
def test_slurm_host_lists_expand_in_order_with_their_padding(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text, why",
    [
        ("gpu[01-04", "its brackets do not pair up"),
        ("gpu01-04]", "its brackets do not pair up"),
        ("gpu[[1]]", "its brackets do not pair up"),
        ("gpu[4-1]", "the range '4-1' runs backwards"),
        ("gpu[a-b]", "[a-b] holds 'a-b', not N or N-M"),
        ("gpu[¹-³]", "[¹-³] holds '¹-³', not N or N-M"),
        (
            "gpu1,,gpu2",
            "'' is not a host name or name[range] (of letters, digits, '.', '-' and '_')",
        ),
        (
            "gpu 07",
            "'gpu 07' is not a host name or name[range] (of letters, digits, '.', '-' and '_')",
        ),
        (
            "n[0-999999999999]",
            "it names 1000000000000 nodes, more than the 100000 a cluster here may have",
        ),
        (
            "a[0-9999]b[0-99]",
            "it names 1000000 nodes, more than the 100000 a cluster here may have",
        ),
    ],
)
def test_a_bad_host_list_is_named(text, why):
    with pytest.raises(ValueError) as raised:
        expand_hostlist(text)
    assert str(raised.value) == (
        f"SLURM's node list {text!r} cannot be read: {why}. It should look like "
        "gpu[01-04,07],cpu3; run the task under srun, which sets it."
    )


def test_a_host_list_of_ten_million_names_is_refused_at_once_in_a_short_line():
    text = "gpu01," * 10_000_000
    started = time.monotonic()
    with pytest.raises(ValueError) as raised:
        expand_hostlist(text, "SLURM_JOB_NODELIST")
    assert time.monotonic() - started < 1
    assert str(raised.value) == (
        f"SLURM's node list SLURM_JOB_NODELIST={text[:200]!r}... (60000000 characters) cannot "
        "be read: it is 60000000 characters long. It should look like gpu[01-04,07],cpu3; run "
        "the task under srun, which sets it."
    )


def test_tasks_per_node_expand_and_a_bad_one_is_named():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match=r"'2x3' is not N or N\(xM\) \(like 2\(x3\),1\)"):
        expand_tasks_per_node("2x3")
    with pytest.raises(ValueError, match=r"'²' is not N or N\(xM\)"):
        expand_tasks_per_node("²")
    started = time.monotonic()
    with pytest.raises(ValueError) as raised:
        expand_tasks_per_node("1(x1000000000)", "SLURM_TASKS_PER_NODE")
    assert time.monotonic() - started < 1
    assert str(raised.value) == (
        "SLURM's tasks per node SLURM_TASKS_PER_NODE='1(x1000000000)' gives 1000000000 task(s) "
        "on 1000000000 node(s), more than the 100000 a cluster here may have; run the task "
        "under srun, which sets it."
    )


# SLURM 22.05's variables, as `sbatch --nodes=3 --ntasks=5` gives them (the job of the
# tests: gpu01 and gpu02 with two tasks each, cpu3 with one). An sbatch script's own
# shell runs on the first node as task 0 of the batch step; it has the job's node
# list and task layout but none of the SLURM_STEP_* variables srun gives its tasks.


def batch_shell(job="4321", nodes="gpu[01-02],cpu3", per_node="2(x2),1", tasks=5, **more):
    """The environment of an sbatch script's own shell (outside any srun)."""
    hosts = expand_hostlist(nodes)
    environ = {
        "ENVIRONMENT": "BATCH",
        "SLURM_CLUSTER_NAME": "hpc",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_CPUS_ON_NODE": "8",
        "SLURM_GTIDS": "0",
        "SLURM_JOBID": job,
        "SLURM_JOB_ACCOUNT": "vision",
        "SLURM_JOB_CPUS_PER_NODE": "8(x3)",
        "SLURM_JOB_GID": "1000",
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NAME": "digits",
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_JOB_NUM_NODES": str(len(hosts)),
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_QOS": "normal",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_USER": "alice",
        "SLURM_LOCALID": "0",
        "SLURM_NNODES": str(len(hosts)),
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": nodes,
        "SLURM_NODE_ALIASES": "(null)",
        "SLURM_NPROCS": str(tasks),
        "SLURM_NTASKS": str(tasks),
        "SLURM_OPEN_MODE": "a",
        "SLURM_PRIO_PROCESS": "0",
        "SLURM_PROCID": "0",
        "SLURM_SUBMIT_DIR": "/home/alice/digits",
        "SLURM_SUBMIT_HOST": "login1",
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_TASK_PID": "48213",
        "SLURM_TOPOLOGY_ADDR": hosts[0],
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_WORKING_CLUSTER": "hpc:10.1.0.1:6817:9728:109",
        "SLURMD_NODENAME": hosts[0],
    }
    environ.update(more)
    return environ


def srun(rank, nodes="gpu[01-02],cpu3", per_node="2(x2),1", tasks=5, job="4321", **more):
    """The environment srun gives task `rank` of step 0 (block placement) in that job."""
    hosts = expand_hostlist(nodes)
    placed = [
        (host, local)
        for host, count in zip(hosts, expand_tasks_per_node(per_node))
        for local in range(count)
    ]
    host, local = placed[rank]
    environ = batch_shell(job, nodes, per_node, tasks)
    environ.update(
        {
            "SLURM_CPU_BIND": "quiet,mask_cpu:0x000000FF",
            "SLURM_DISTRIBUTION": "block",
            "SLURM_GTIDS": str(rank),
            "SLURM_LAUNCH_NODE_IPADDR": "10.1.0.11",
            "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(hosts.index(host)),
            "SLURM_PROCID": str(rank),
            "SLURM_SRUN_COMM_HOST": "10.1.0.11",
            "SLURM_SRUN_COMM_PORT": "42137",
            "SLURM_STEPID": "0",
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_LAUNCHER_PORT": "42137",
            "SLURM_STEP_NODELIST": nodes,
            "SLURM_STEP_NUM_NODES": str(len(hosts)),
            "SLURM_STEP_NUM_TASKS": str(tasks),
            "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_TASK_PID": str(51000 + rank),
            "SLURM_TOPOLOGY_ADDR": host,
            "SLURM_UMASK": "0022",
            "SLURMD_NODENAME": host,
        }
    )
    environ.update(more)
    return environ


def test_every_srun_task_resolves_to_one_cluster_and_its_own_place_in_it():
    # Job 4321: port slot 321 of 40 ports each from 20000.
    base = 20000 + 321 * 40
    expected = [
        f"gpu01:{base}",
        f"gpu01:{base + 1}",
        f"gpu02:{base}",
        f"gpu02:{base + 1}",
        f"cpu3:{base}",
    ]
    for rank in range(5):
        found = find_cluster("multi_worker_mirrored", "auto", environ=srun(rank))
        assert found.found_by == "slurm"
        assert found.cluster == {"worker": expected}
        assert (found.task_type, found.task_index) == ("worker", rank)
    assert found.line() == f"cluster: slurm, 5 workers, this task worker 4 at cpu3:{base}"
    explicit = find_cluster("multi_worker_mirrored", "slurm", port=2222, environ=srun(2))
    assert explicit.cluster["worker"][2:4] == ["gpu02:2222", "gpu02:2223"]
    assert explicit.line() == "cluster: slurm, 5 workers, this task worker 2 at gpu02:2222"


def test_a_parameter_server_cluster_from_srun_has_a_chief_then_servers_then_workers():
    environ = srun(3, nodes="n[1-5]", per_node="1(x5)", tasks=5)
    found = find_cluster("parameter_server", "slurm", port=3000, num_ps=2, environ=environ)
    assert found.cluster == {
        "chief": ["n1:3000"],
        "ps": ["n2:3000", "n3:3000"],
        "worker": ["n4:3000", "n5:3000"],
    }
    assert (found.task_type, found.task_index) == ("worker", 0)
    assert found.line() == (
        "cluster: slurm, 1 chief, 2 ps, 2 workers, this task worker 0 at n4:3000"
    )
    with pytest.raises(ValueError, match=r"needs --cluster_num_ps >= 1 and at least"):
        find_cluster("parameter_server", "slurm", num_ps=0, environ=environ)
    with pytest.raises(ValueError, match=r"--cluster_num_ps=1 asks for parameter servers"):
        find_cluster("multi_worker_mirrored", "slurm", num_ps=1, environ=environ)


SLURM_INCONSISTENT = {
    "a rank outside the step": (
        dict(SLURM_PROCID="5"),
        "SLURM_PROCID=5 is outside the step's 5 task(s) (SLURM_STEP_NUM_TASKS); each task "
        "needs its own rank below the task count, which srun gives.",
    ),
    "tasks per node that do not add up": (
        dict(SLURM_STEP_NUM_TASKS="6"),
        "SLURM_STEP_TASKS_PER_NODE='2(x2),1' adds up to 5 task(s), but the step has 6; both "
        "must come from the same srun step.",
    ),
    "a node count that does not match the node list": (
        dict(SLURM_STEP_TASKS_PER_NODE="2,3"),
        "SLURM_STEP_TASKS_PER_NODE='2,3' gives 2 node(s) but SLURM_STEP_NODELIST lists 3 "
        "(gpu01, gpu02, cpu3); both must come from the same srun step.",
    ),
    "a node listed twice": (
        dict(SLURM_STEP_NODELIST="gpu[01-02],gpu01"),
        "SLURM_STEP_NODELIST='gpu[01-02],gpu01' lists gpu01 more than once, so two tasks "
        "would serve on one port; list each node once (srun does).",
    ),
    "a task on another node than its rank's": (
        dict(SLURMD_NODENAME="cpu3"),
        "SLURM runs task 1 on 'cpu3', but placing tasks block by block over the node list puts "
        "it on gpu01 as task 1 of that node, which the other tasks will look for; start the "
        "step with srun --distribution=block.",
    ),
    "cyclic placement": (
        dict(SLURMD_NODENAME="", SLURM_NODEID="1", SLURM_LOCALID="0"),
        "SLURM runs task 1 on node 1 (gpu02), but placing tasks block by block",
    ),
    "a task that is another of its node's": (
        dict(SLURMD_NODENAME="", SLURM_LOCALID="0"),
        "SLURM runs task 1 as task 0 of its node, but placing tasks block by block",
    ),
    "ports past 65535": (
        dict(),
        "Port 65535 plus 2 tasks on a node runs past 65535; pass a lower --cluster_port.",
    ),
    "no rank": (
        dict(SLURM_PROCID="x"),
        "SLURM_PROCID (this task's rank) is 'x', not a whole number in the digits 0-9; run the "
        "command under srun (in an sbatch script: srun <command>).",
    ),
    "a rank in a digit int() refuses": (
        dict(SLURM_PROCID="²"),
        "SLURM_PROCID (this task's rank) is '²', not a whole number in the digits 0-9; run the "
        "command under srun (in an sbatch script: srun <command>).",
    ),
    "a rank in another script's digits": (
        dict(SLURM_PROCID="١"),
        "SLURM_PROCID (this task's rank) is '١', not a whole number in the digits 0-9;",
    ),
    "a node number beyond the node list": (
        dict(SLURM_NODEID="3"),
        "SLURM_NODEID=3 is outside the 3 node(s) of SLURM_STEP_NODELIST='gpu[01-02],cpu3' "
        "(numbered from 0); both must come from the same srun step: run the command under srun "
        "(in an sbatch script: srun <command>).",
    ),
    "a node number that is no number": (
        dict(SLURM_NODEID="-1"),
        "SLURM_NODEID (this task's node) is '-1', not a whole number in the digits 0-9;",
    ),
    "a task count past any cluster": (
        dict(SLURM_STEP_NUM_TASKS="1000000000"),
        "SLURM_STEP_NUM_TASKS=1000000000 (the step's task count) is not a task count from 1 to "
        "100000; run the command under srun (in an sbatch script: srun <command>).",
    ),
    "a node list range of 10^12 names": (
        dict(SLURM_STEP_NODELIST="gpu[000000000001-999999999999]"),
        "SLURM's node list SLURM_STEP_NODELIST='gpu[000000000001-999999999999]' cannot be read: "
        "it names 999999999999 nodes, more than the 100000 a cluster here may have.",
    ),
    "tasks per node of 10^9 nodes": (
        dict(SLURM_STEP_TASKS_PER_NODE="1(x1000000000)"),
        "SLURM's tasks per node SLURM_STEP_TASKS_PER_NODE='1(x1000000000)' gives 1000000000 "
        "task(s) on 1000000000 node(s), more than the 100000 a cluster here may have;",
    ),
    "uneven tasks without tasks per node": (
        dict(SLURM_STEP_TASKS_PER_NODE="", SLURM_TASKS_PER_NODE=""),
        "5 SLURM task(s) do not spread evenly over the 3 node(s) of SLURM_STEP_NODELIST, and "
        "SLURM_STEP_TASKS_PER_NODE, which says how they spread, is unset; run the command "
        "under srun, which sets it.",
    ),
}


@pytest.mark.parametrize("case", list(SLURM_INCONSISTENT))
def test_each_inconsistent_or_malformed_srun_environment_is_a_sentence_at_once(case):
    changes, sentence = SLURM_INCONSISTENT[case]
    port = 65535 if case == "ports past 65535" else None
    started = time.monotonic()
    with pytest.raises(ValueError) as raised:
        find_cluster("multi_worker_mirrored", "auto", port=port, environ=srun(1, **changes))
    assert time.monotonic() - started < 1
    assert str(raised.value).startswith(sentence)


def test_the_steps_variables_are_taken_over_the_jobs():
    # `srun --nodes=2 --ntasks=2` in a job of 4 nodes: the job's variables still say 4.
    environ = srun(1, nodes="gpu[01-02]", per_node="1(x2)", tasks=2, job="77")
    environ.update(
        SLURM_JOB_NODELIST="gpu[01-04]",
        SLURM_NODELIST="gpu[01-04]",
        SLURM_NTASKS="4",
        SLURM_TASKS_PER_NODE="1(x4)",
    )
    found = find_cluster("multi_worker_mirrored", port=2222, environ=environ)
    assert found.line() == "cluster: slurm, 2 workers, this task worker 1 at gpu02:2222"
    assert found.cluster == {"worker": ["gpu01:2222", "gpu02:2222"]}


def indexed_job(index, tasks=3, hostname=None, **more):
    """The environment of pod `index` of Indexed Job `train` behind Service `train-workers`."""
    environ = {
        "JOB_COMPLETION_INDEX": str(index),
        "HOSTNAME": f"train-{index}" if hostname is None else hostname,
        scheduler_cluster.KUBERNETES_TASKS_VARIABLE: str(tasks),
        scheduler_cluster.KUBERNETES_SERVICE_VARIABLE: "train-workers",
    }
    environ.update(more)
    return environ


def test_every_pod_of_an_indexed_job_resolves_to_one_cluster_and_its_own_place():
    expected = [f"train-{index}.train-workers:2222" for index in range(3)]
    for index in range(3):
        found = find_cluster("multi_worker_mirrored", "auto", environ=indexed_job(index))
        assert found.found_by == "kubernetes"
        assert found.cluster == {"worker": expected}
        assert found.task_index == index
    assert found.line() == (
        "cluster: kubernetes, 3 workers, this task worker 2 at train-2.train-workers:2222"
    )
    named = indexed_job(1, hostname="elsewhere", LOOPS_CLUSTER_JOB="run7")
    found = find_cluster("parameter_server", "kubernetes", port=5000, num_ps=1, environ=named)
    assert found.cluster == {
        "chief": ["run7-0.train-workers:5000"],
        "ps": ["run7-1.train-workers:5000"],
        "worker": ["run7-2.train-workers:5000"],
    }
    assert (found.task_type, found.task_index) == ("ps", 0)


KUBERNETES_INCONSISTENT = {
    "an index outside the job": (
        indexed_job(3),
        "JOB_COMPLETION_INDEX=3 is outside the Job's 3 pod(s) (LOOPS_CLUSTER_TASKS=3); set "
        "LOOPS_CLUSTER_TASKS to the Job's completions.",
    ),
    "no task count": (
        {k: v for k, v in indexed_job(0).items() if k != "LOOPS_CLUSTER_TASKS"},
        "LOOPS_CLUSTER_TASKS (the Job's completions) is unset, not a whole number in the digits "
        "0-9; set it in the pod's environment to the Job's completions; run the pod in an "
        "Indexed Job (loops-launch --print=kubernetes writes one).",
    ),
    "a task count of 10^9": (
        indexed_job(0, tasks=1_000_000_000),
        "LOOPS_CLUSTER_TASKS=1000000000 (the Job's completions) is not a task count from 1 to "
        "100000; set it in the pod's environment to the Job's completions; run the pod in an "
        "Indexed Job (loops-launch --print=kubernetes writes one).",
    ),
    "an index in a digit int() refuses": (
        indexed_job(0, JOB_COMPLETION_INDEX="²"),
        "JOB_COMPLETION_INDEX (this pod's index in its Job) is '²', not a whole number in the "
        "digits 0-9;",
    ),
    "a Service name with a space": (
        indexed_job(0, LOOPS_CLUSTER_SERVICE="train workers"),
        "LOOPS_CLUSTER_SERVICE='train workers' (the headless Service the Job's pods name as "
        "their subdomain) is not a DNS name, so no address built from it would resolve: each "
        "part between dots must be 1-63 lower-case letters, digits and '-', starting and ending "
        "with a letter or digit (RFC 1123); set it to that Service's name.",
    ),
    "a Job name with '/' and ':'": (
        indexed_job(0, LOOPS_CLUSTER_JOB="team/run:7"),
        "LOOPS_CLUSTER_JOB='team/run:7' (the Indexed Job's name) is not a DNS name, so no "
        "address built from it would resolve: each part between dots must be",
    ),
    "a Job name whose pods' names are too long": (
        indexed_job(0, tasks=12, LOOPS_CLUSTER_JOB="r" * 61),
        f"The Job's pods are named {'r' * 61}-0 to {'r' * 61}-11, and '{'r' * 61}-11' is not a "
        "DNS label (1-63 lower-case letters, digits and '-', RFC 1123), so its address would "
        "not resolve; give the Job a shorter name of such characters (LOOPS_CLUSTER_JOB).",
    ),
    "a host name in capitals": (
        indexed_job(1, hostname="Train-1"),
        "The Job's pods are named Train-0 to Train-2, and 'Train-2' is not a DNS label",
    ),
    "no service": (
        indexed_job(0, LOOPS_CLUSTER_SERVICE=""),
        "LOOPS_CLUSTER_SERVICE is unset: it names the headless Service the Job's pods name as "
        "their subdomain, through which they reach each other; set it",
    ),
    "a host name that is not the job's": (
        indexed_job(1, hostname="train-7"),
        "This pod's host name 'train-7' is not <job>-1, which names the pods of an Indexed "
        "Job; set LOOPS_CLUSTER_JOB to the Job's name.",
    ),
}


@pytest.mark.parametrize("case", list(KUBERNETES_INCONSISTENT))
def test_each_inconsistent_or_malformed_kubernetes_environment_is_a_sentence_at_once(case):
    environ, sentence = KUBERNETES_INCONSISTENT[case]
    started = time.monotonic()
    with pytest.raises(ValueError) as raised:
        find_cluster("multi_worker_mirrored", "auto", environ=environ)
    assert time.monotonic() - started < 1
    assert str(raised.value).startswith(sentence)


def test_a_service_may_be_named_with_its_namespace():
    environ = indexed_job(1, tasks=2, LOOPS_CLUSTER_SERVICE="train-workers.vision")
    found = find_cluster("multi_worker_mirrored", environ=environ)
    assert found.cluster == {
        "worker": ["train-0.train-workers.vision:2222", "train-1.train-workers.vision:2222"]
    }


def test_auto_trusts_tf_config_then_slurm_then_kubernetes():
    tf_config = json.dumps(
        {"cluster": {"worker": ["h1:1", "h2:2"]}, "task": {"type": "worker", "index": 1}}
    )
    everything = {**indexed_job(0), **srun(0), "TF_CONFIG": tf_config}
    assert find_cluster("multi_worker_mirrored", environ=everything).found_by == "tf_config"
    assert find_cluster("multi_worker_mirrored", environ=everything).line() == (
        "cluster: TF_CONFIG, 2 workers, this task worker 1 at h2:2"
    )
    del everything["TF_CONFIG"]
    assert find_cluster("multi_worker_mirrored", environ=everything).found_by == "slurm"
    assert find_cluster("multi_worker_mirrored", environ=indexed_job(0)).found_by == "kubernetes"
    # Named, a source wins over TF_CONFIG.
    everything["TF_CONFIG"] = tf_config
    found = find_cluster("multi_worker_mirrored", "kubernetes", environ=everything)
    assert found.found_by == "kubernetes"


def test_no_cluster_names_what_was_looked_for():
    with pytest.raises(ValueError) as raised:
        find_cluster("multi_worker_mirrored", environ={})
    assert str(raised.value).startswith(
        "--strategy=multi_worker_mirrored runs one process per task of a cluster, but no "
        "cluster was found: TF_CONFIG is unset, and neither SLURM's srun (SLURM_STEP_ID) nor a "
        "Kubernetes Indexed Job (JOB_COMPLETION_INDEX) started this process. To give a cluster"
    )


def srun_line(command):
    """The srun line of the sbatch script loops-launch --print=slurm writes for `command`."""
    script = templates.slurm_script(command, 2)
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return line


COMMAND = ["loops-classifier", "--strategy=multi_worker_mirrored", "--model_dir=/shared/my run"]


@pytest.mark.parametrize("source", ["auto", "slurm"])
def test_a_cluster_strategy_in_a_batch_scripts_shell_is_told_the_srun_line(source):
    # SLURM sets SLURM_PROCID=0 and SLURM_NTASKS=5 in the batch shell too: taken for
    # task 0, it printed "this task worker 0" and waited 600 s for tasks that never came.
    with pytest.raises(ValueError) as raised:
        find_cluster("multi_worker_mirrored", source, environ=batch_shell(), command=COMMAND)
    line = srun_line(COMMAND)
    assert line.endswith(
        " loops-classifier --strategy=multi_worker_mirrored '--model_dir=/shared/my run'"
    )
    assert str(raised.value) == (
        "--strategy=multi_worker_mirrored runs one process per task of a cluster, and this "
        "process is the shell of SLURM job 4321 (its sbatch script or salloc), not a task of "
        "an srun step (SLURM_JOB_ID is set, SLURM_STEP_ID is not): taken for a task, it would "
        "wait for the others for ever. Start the command with srun in the sbatch script, one "
        f"task per node, as loops-launch --print=slurm writes it: {line}"
    )
    with pytest.raises(ValueError) as raised:
        find_cluster("parameter_server", "slurm", num_ps=1, environ={}, command=COMMAND)
    assert str(raised.value).startswith(
        "--strategy=parameter_server runs one process per task of a cluster, and SLURM did not "
        "start this process (SLURM_JOB_ID and SLURM_STEP_ID are unset). Start the command with "
        "srun"
    )
    # TF_CONFIG given by hand in the batch shell is the user's cluster: it is taken.
    tf_config = json.dumps(
        {"cluster": {"worker": ["h1:1"]}, "task": {"type": "worker", "index": 0}}
    )
    found = find_cluster("multi_worker_mirrored", environ=batch_shell(TF_CONFIG=tf_config))
    assert found.line() == "cluster: TF_CONFIG, 1 worker, this task worker 0 at h1:1"


@pytest.mark.parametrize("strategy", ["mirrored", "one_device", "default"])
def test_a_one_process_strategy_in_a_batch_scripts_shell_just_runs(strategy):
    assert find_cluster(strategy, environ=batch_shell()) is None


def test_a_one_process_strategy_started_as_several_tasks_is_refused():
    with pytest.raises(ValueError) as raised:
        find_cluster("mirrored", environ=srun(0))
    assert str(raised.value) == (
        "srun started 5 tasks of this command, but --strategy=mirrored trains in one process, "
        "so each task would train alone on the same model_dir; use "
        "--strategy=multi_worker_mirrored (one cluster of all tasks), or start one task."
    )
    with pytest.raises(ValueError, match="^the Kubernetes Job started 3 tasks of this command"):
        find_cluster("default", environ=indexed_job(0))
    one_task = srun(0, nodes="n1", per_node="1", tasks=1)
    assert find_cluster("mirrored", environ=one_task) is None
    with pytest.raises(ValueError, match="^--cluster=slurm says where the tasks of a multi-"):
        find_cluster("mirrored", "slurm", environ=one_task)


def test_adopting_writes_tf_config_once_and_it_passes_the_cluster_check(monkeypatch):
    environ = srun(1, nodes="localhost", per_node="2", tasks=2)
    found = adopt_cluster("multi_worker_mirrored", port=40000, environ=environ)
    assert json.loads(environ["TF_CONFIG"]) == {
        "cluster": {"worker": ["localhost:40000", "localhost:40001"]},
        "task": {"type": "worker", "index": 1},
    }
    assert environ[scheduler_cluster.FOUND_BY_VARIABLE] == "slurm"
    # Adopted once: the second call (make_strategy after the command line) finds nothing new.
    assert adopt_cluster("multi_worker_mirrored", environ=environ) is None
    assert found.line() == "cluster: slurm, 2 workers, this task worker 1 at localhost:40001"
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    cluster_config.check_cluster("multi_worker_mirrored")


def test_only_a_kubernetes_cluster_may_name_peers_that_do_not_resolve_yet(monkeypatch):
    environ = indexed_job(0, tasks=2)
    adopt_cluster("multi_worker_mirrored", port=40002, environ=environ)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    # train-1.train-workers resolves nowhere; its pod may not run yet, and the wait retries.
    cluster_config.check_cluster("multi_worker_mirrored")
    monkeypatch.delenv(scheduler_cluster.FOUND_BY_VARIABLE)
    with pytest.raises(ValueError, match="which does not resolve"):
        cluster_config.check_cluster("multi_worker_mirrored")


def test_a_slurm_node_name_that_does_not_resolve_is_named_as_slurms_node(monkeypatch):
    # SLURM itself needs only NodeAddr; the tasks reach each other by node name.
    environ = srun(0, nodes="localhost,gpu07.invalid", per_node="1(x2)", tasks=2)
    adopt_cluster("multi_worker_mirrored", port=40004, environ=environ)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        cluster_config.check_cluster("multi_worker_mirrored")
    sentence = str(raised.value)
    assert sentence.startswith(
        "SLURM's node list names the node 'gpu07.invalid' for worker_1 (gpu07.invalid:40004), "
        "and that name does not resolve on this node ("
    )
    assert sentence.endswith(
        "): the tasks reach each other by node name, while SLURM itself needs only each node's "
        "NodeAddr. Make every node name resolve on every node (DNS or /etc/hosts), or set "
        'TF_CONFIG yourself on every task with addresses that do (like {"cluster": {"worker": '
        '["host:port", ...]}, "task": {"type": "worker", "index": 0}}); it is read before '
        "SLURM's variables."
    )
    assert "TF_CONFIG gives" not in sentence


def test_a_binary_started_by_srun_as_several_one_process_tasks_stops_before_tensorflow():
    environment = dict(os.environ, **srun(0, nodes="n1", per_node="2", tasks=2))
    environment.pop("TF_CONFIG", None)
    finished = subprocess.run(
        [sys.executable, "-m", "loops.bin.classifier", "--strategy=mirrored", "--num_replicas=1"],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 1
    assert finished.stderr.strip().endswith(
        "error: srun started 2 tasks of this command, but --strategy=mirrored trains in one "
        "process, so each task would train alone on the same model_dir; use "
        "--strategy=multi_worker_mirrored (one cluster of all tasks), or start one task."
    )


# ---- The templates loops-launch prints: what each gives its tasks resolves to the cluster. ----

# Runs each task of an sbatch script's step as srun would on the nodes of
# $FAKE_NODES (one task per node, block placement), then exits with the
# highest exit code, or $FAKE_EXIT when set (a preempted step).
FAKE_SRUN = """#!{python}
import os, subprocess, sys
sys.path.insert(0, {root!r})
from loops.cluster.scheduler_cluster import expand_hostlist
args = sys.argv[1:]
options = []
while args[0].startswith("--"):
    options.append(args.pop(0))
assert options == ["--label", "--distribution=block"], options
nodes = expand_hostlist(os.environ["FAKE_NODES"])
codes = []
for rank, node in enumerate(nodes):
    env = dict(os.environ, SLURM_STEP_ID="0", SLURM_STEPID="0", SLURM_PROCID=str(rank),
               SLURM_STEP_NUM_TASKS=str(len(nodes)), SLURM_STEP_NUM_NODES=str(len(nodes)),
               SLURM_STEP_NODELIST=os.environ["FAKE_NODES"],
               SLURM_STEP_TASKS_PER_NODE="1(x%d)" % len(nodes), SLURM_NODEID=str(rank),
               SLURM_LOCALID="0", SLURMD_NODENAME=node, SLURM_GTIDS=str(rank))
    codes.append(subprocess.run(args, env=env).returncode)
sys.exit(int(os.environ.get("FAKE_EXIT") or max(codes)))
"""
FAKE_SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "$FAKE_LOG"
"""


def printed(capsys, *argv):
    from loops.cluster import launch

    assert launch.main(list(argv)) == 0
    return capsys.readouterr().out


def run_script(script, tmp_path, nodes, fake_exit=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text.format(python=sys.executable, root=ROOT))
        (bin_dir / name).chmod(0o755)
    # The script's python3 is this one, with loops importable.
    if not (bin_dir / "python3").exists():
        (bin_dir / "python3").symlink_to(sys.executable)
    log = tmp_path / "scontrol.log"
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SLURM", "TF_CONFIG", "JOB_COMPLETION", "LOOPS_CLUSTER"))
    }
    # The script runs in the batch shell of job 9, one task per node.
    count = len(expand_hostlist(nodes))
    environment.update(batch_shell("9", nodes, f"1(x{count})", count))
    environment.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=ROOT,
        FAKE_NODES=nodes,
        FAKE_EXIT=fake_exit,
        FAKE_LOG=str(log),
    )
    finished = subprocess.run(
        ["bash", "-c", script], env=environment, capture_output=True, text=True, timeout=60
    )
    return finished, (log.read_text() if log.exists() else "")


def test_the_slurm_template_gives_each_task_its_place_and_requeues_a_preempted_job(
    capsys, tmp_path
):
    script = printed(
        capsys,
        "--print=slurm",
        "--num_workers=2",
        "--num_ps=1",
        "--job_name=digits",
        "--",
        "loops.cluster.task_cluster",
        "--strategy=parameter_server",
        "--model_dir=/shared/run",
    )
    directives = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "--job-name=digits",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--signal=USR1@90",
        "--requeue",
        "--open-mode=append",
        "--output=digits-%j.out",
    ]
    assert (
        "srun --label --distribution=block python3 -m loops.cluster.task_cluster "
        "--strategy=parameter_server --model_dir=/shared/run --cluster_num_ps=1\n" in script
    )
    # Each of the 4 tasks finds the same cluster and its own place in it.
    finished, requeued = run_script(script, tmp_path, "gpu[01-04]")
    assert finished.returncode == 0, finished.stderr
    lines = [line for line in finished.stdout.splitlines() if line.startswith("cluster:")]
    slurm_ports = 20000 + 9 * 40
    assert lines == [
        f"cluster: slurm, 1 chief, 1 ps, 2 workers, this task {task} at gpu0{node}:{slurm_ports}"
        for task, node in (("chief 0", 1), ("ps 0", 2), ("worker 0", 3), ("worker 1", 4))
    ]
    assert requeued == ""
    # A preempted step (every task saved and exited 42): the job is requeued and exits 42.
    finished, requeued = run_script(script, tmp_path, "gpu[01-04]", fake_exit="42")
    assert finished.returncode == 42
    assert requeued == "scontrol requeue 9\n"
    assert "preempted (exit 42): requeueing job 9" in finished.stderr


def test_the_kubernetes_template_gives_each_pod_its_place_and_replaces_preempted_pods(capsys):
    manifest = json.loads(
        printed(
            capsys,
            "--print=kubernetes",
            "--num_workers=3",
            "--image=registry.example.com/loops:1",
            "--job_name=digits",
            "--port=2345",
            "--",
            "loops.bin.classifier",
            "--strategy=multi_worker_mirrored",
            "--model_dir=/shared/run",
        )
    )
    service, job = manifest["items"]
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "digits"}
    assert service["spec"]["ports"] == [{"name": "tensorflow", "port": 2345}]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == job["metadata"]["name"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 90
    exit_rule, disruption_rule = spec["podFailurePolicy"]["rules"]
    assert exit_rule == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "task", "operator": "In", "values": [42]},
    }
    assert disruption_rule["onPodConditions"] == [{"type": "DisruptionTarget"}]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/loops:1"
    assert container["command"] == [
        "python3",
        "-m",
        "loops.bin.classifier",
        "--strategy=multi_worker_mirrored",
        "--model_dir=/shared/run",
    ]
    # What each pod sees: the manifest's environment, Kubernetes' index and host name.
    environment = {variable["name"]: variable["value"] for variable in container["env"]}
    expected = [f"digits-{index}.digits:2345" for index in range(3)]
    for index in range(3):
        pod_environ = dict(environment, JOB_COMPLETION_INDEX=str(index), HOSTNAME=f"digits-{index}")
        found = find_cluster("multi_worker_mirrored", port=2345, environ=pod_environ)
        assert found.cluster == {"worker": expected} and found.task_index == index


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--print=kubernetes", "--num_workers=2"], "--print=kubernetes needs --image"),
        (
            ["--print=kubernetes", "--num_workers=2", "--image=x", "--job_name=Big_Run"],
            "--job_name='Big_Run' cannot name a Kubernetes Job and Service (it holds 'B'): use "
            "lowercase letters, digits and '-', starting with a letter",
        ),
        (["--print=slurm", "--num_workers=0"], "--num_workers=0: a cluster needs at least one"),
        (["--print=slurm", "--num_workers=2", "--evaluator"], "a template has none"),
    ],
)
def test_template_arguments_that_cannot_work_are_named(capsys, argv, message):
    from loops.cluster import launch

    with pytest.raises(SystemExit) as exited:
        launch.main([*argv, "--", "loops.bin.classifier"])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
