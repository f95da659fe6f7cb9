"""A cluster task whose peers never come up, or whose TF_CONFIG is wrong, says so in time."""

import contextlib
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
import tensorflow as tf

from conftest import ROOT
from loops.cluster import launch, parameter_server, strategies
from loops.vocabulary import exit_codes

ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("TF_CONFIG", strategies.CLUSTER_TIMEOUT_VARIABLE)
}
ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
# Seconds the subprocesses wait for their missing peers; well below the 600 s default.
BOUND = 4
# Imports TensorFlow first, so the time it prints is make_strategy's alone.
MAKE_STRATEGY = """
import sys, time
import loops.cluster.strategies
started = time.monotonic()
try:
    loops.cluster.strategies.make_strategy(sys.argv[1])
finally:
    print(f"make_strategy returned after {time.monotonic() - started:.2f} s", flush=True)
"""


def tf_config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def addresses(count):
    return [f"127.0.0.1:{port}" for port in launch.free_ports(count)]


def start(strategy, config, **env):
    return subprocess.Popen(
        [sys.executable, "-c", MAKE_STRATEGY, strategy],
        env=dict(ENV, TF_CONFIG=config, **env),
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize(
    "strategy, cluster_of, this_task, missing",
    [
        ("multi_worker_mirrored", lambda a: {"worker": a[:2]}, ("worker", 0), "worker_1 at {1}"),
        (
            "parameter_server",
            lambda a: {"chief": a[:1], "worker": a[1:2], "ps": a[2:3]},
            ("chief", 0),
            "worker_0 at {1}, ps_0 at {2}",
        ),
    ],
)
def test_a_task_whose_peers_never_come_up_names_them_within_its_bound(
    strategy, cluster_of, this_task, missing
):
    cluster = addresses(3)
    task = start(
        strategy,
        tf_config(cluster_of(cluster), *this_task),
        **{strategies.CLUSTER_TIMEOUT_VARIABLE: str(BOUND)},
    )
    stdout, stderr = task.communicate(timeout=120)
    assert task.returncode == 1, stderr
    missing = missing.format(*cluster)
    name = f"{this_task[0]}_{this_task[1]}"
    assert f"{name} waiting up to {BOUND} s for {missing}\n" in stderr
    assert (
        f"ValueError: {name} waited {BOUND} s for its cluster, but {missing} did not come up "
        "(nothing accepts connections there); start "
    ) in stderr
    assert (
        "or set LOOPS_CLUSTER_TIMEOUT_SECONDS (or make_strategy's cluster_timeout) higher" in stderr
    )
    seconds = float(re.search(r"make_strategy returned after ([\d.]+) s", stdout).group(1))
    print(f"{strategy}: gave up after {seconds:.2f} s (bound {BOUND} s)")
    assert BOUND <= seconds < BOUND + 1.5


def test_the_binary_says_which_worker_is_missing_without_a_traceback(tmp_path, digits_dir):
    cluster = addresses(2)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loops.bin.classifier",
            "--strategy=multi_worker_mirrored",
            "--num_replicas=1",
            f"--model_dir={tmp_path}",
            f"--data_dir={digits_dir}",
        ],
        env=dict(
            ENV,
            TF_CONFIG=tf_config({"worker": cluster}, index=1),
            **{strategies.CLUSTER_TIMEOUT_VARIABLE: "2"},
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert (
        f"worker_1 waited 2 s for its cluster, but worker_0 at {cluster[0]} did not come up"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_sigterm_while_waiting_exits_promptly_as_preempted():
    task = start("multi_worker_mirrored", tf_config({"worker": addresses(2)}))
    line = task.stderr.readline()
    while "waiting up to" not in line:
        assert line, "the task ended before it waited"
        line = task.stderr.readline()
    assert line.startswith("worker_0 waiting up to 600 s for worker_1 at 127.0.0.1:")
    sent = time.monotonic()
    task.send_signal(signal.SIGTERM)
    code = task.wait(timeout=60)
    seconds = time.monotonic() - sent
    print(f"exited {seconds:.2f} s after SIGTERM")
    assert code == exit_codes.PREEMPTED == 42
    assert task.stderr.read().startswith(
        "worker_0 received SIGTERM while starting its cluster (waiting for its peers or in "
        "TensorFlow's start-up), before any work; exiting with code 42 (preempted): rerun the "
        "same command to start again.\n"
    )
    assert seconds < 5  # inside TensorFlow's own wait SIGTERM did nothing


def test_waiting_tasks_see_each_other_and_stop_waiting():
    # worker_1 comes up only after it has seen worker_0, as a waiting peer does:
    # worker_0 must listen on its own port while it waits.
    cluster = addresses(2)
    ports = [int(address.rsplit(":", 1)[1]) for address in cluster]
    seen_worker_0 = threading.Event()

    def worker_1():
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", ports[0]), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        seen_worker_0.set()
        # Up as a waiting task (or TensorFlow's server) is: answering HTTP/2's SETTINGS.
        with socket.create_server(("127.0.0.1", ports[1])) as server:
            server.settimeout(3)
            with contextlib.suppress(OSError), server.accept()[0] as probe:
                probe.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                probe.recv(64)

    thread = threading.Thread(target=worker_1)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": cluster}), task_type="worker", task_id=0
    )
    started = time.monotonic()
    thread.start()
    strategies.wait_for_cluster(resolver, "multi_worker_mirrored", timeout_seconds=10)
    seconds = time.monotonic() - started
    thread.join()
    assert seen_worker_0.is_set()
    assert seconds < 2
    # The port is free again for TensorFlow's server.
    socket.create_server(("127.0.0.1", ports[0])).close()


def test_a_port_taken_by_another_process_is_named(monkeypatch):
    cluster = addresses(2)
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": cluster}))
    port = cluster[0].rsplit(":", 1)[1]
    with socket.create_server(("127.0.0.1", int(port))):
        with pytest.raises(ValueError) as raised:
            strategies.make_strategy("multi_worker_mirrored", cluster_timeout=5)
    assert str(raised.value) == (
        f"Port {port} of worker_0 ({cluster[0]} in TF_CONFIG) is taken by another process; "
        "stop it (an earlier run's task?) or give this task a free port in TF_CONFIG on every "
        "task."
    )


@pytest.mark.parametrize(
    "address, message",
    [
        (
            "127.0.0.1",
            "TF_CONFIG gives worker_1 the address '127.0.0.1', which is not host:port; "
            "write it like 10.0.0.2:2222 (the same cluster on every task).",
        ),
        (
            "127.0.0.1:two",
            "TF_CONFIG gives worker_1 the address '127.0.0.1:two', which is not "
            "host:port; write it like 10.0.0.2:2222",
        ),
        (":2222", "TF_CONFIG gives worker_1 the address ':2222', which is not host:port"),
        (
            "127.0.0.1:70000",
            "TF_CONFIG gives worker_1 port 70000 (in '127.0.0.1:70000'), outside "
            "1..65535; pick a free port in that range (the same cluster on every "
            "task).",
        ),
        ("127.0.0.1:0", "TF_CONFIG gives worker_1 port 0 (in '127.0.0.1:0'), outside 1..65535"),
        (
            "no-such-host.invalid:2222",
            "TF_CONFIG gives worker_1 the host 'no-such-host.invalid' (in "
            "'no-such-host.invalid:2222'), which does not resolve (Name or "
            "service not known); fix its spelling or give its IP address.",
        ),
    ],
)
def test_a_bad_address_is_named_with_the_fix_before_any_work(monkeypatch, address, message):
    monkeypatch.setenv("TF_CONFIG", tf_config({"worker": ["127.0.0.1:2222", address]}))
    with pytest.raises(ValueError) as raised:
        strategies.make_strategy("multi_worker_mirrored")
    assert str(raised.value).startswith(message)
    # A parameter server checks the same before it serves.
    monkeypatch.setenv(
        "TF_CONFIG",
        tf_config(
            {
                "chief": ["127.0.0.1:2221"],
                "worker": ["127.0.0.1:2222", address],
                "ps": ["127.0.0.1:2223"],
            },
            "ps",
        ),
    )
    with pytest.raises(ValueError) as raised:
        parameter_server.serve_unless_chief()
    assert str(raised.value).startswith(message)


def test_a_task_index_outside_the_cluster_is_named(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG", tf_config({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, index=2)
    )
    with pytest.raises(ValueError) as raised:
        strategies.make_strategy("multi_worker_mirrored")
    assert str(raised.value) == (
        "TF_CONFIG names this task worker_2, but its cluster has 2 worker task(s) (indices "
        '[0, 1]); give each task its own index among those in TF_CONFIG\'s "task".'
    )


@pytest.mark.parametrize(
    "keyword, variable, message",
    [
        (None, None, None),
        (None, "90", None),
        (30, "90", None),
        (
            0,
            None,
            "cluster_timeout=0 is not a number of seconds above 0; set it to how long a task "
            "may wait for the others to start, e.g. 600.",
        ),
        (None, "soon", "LOOPS_CLUSTER_TIMEOUT_SECONDS='soon' is not a number of seconds above 0"),
        (None, "-1", "LOOPS_CLUSTER_TIMEOUT_SECONDS='-1' is not a number of seconds above 0"),
        (None, "nan", "LOOPS_CLUSTER_TIMEOUT_SECONDS='nan' is not a number of seconds above 0"),
    ],
)
def test_the_cluster_timeout_comes_from_the_keyword_then_the_variable_then_600_s(
    monkeypatch, keyword, variable, message
):
    if variable is None:
        monkeypatch.delenv(strategies.CLUSTER_TIMEOUT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(strategies.CLUSTER_TIMEOUT_VARIABLE, variable)
    if message is not None:
        with pytest.raises(ValueError, match=re.escape(message)):
            strategies.cluster_timeout_seconds(keyword)
        return
    expected = keyword if keyword is not None else float(variable or 600)
    assert strategies.cluster_timeout_seconds(keyword) == expected
