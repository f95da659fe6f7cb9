"""loops-launch's private network: a local cluster's ports are unreachable from outside it.

The launcher runs on a host made of a network namespace (`network_hosts`), so
that another namespace can try the ports at the host's own address; the tasks
are small Python stand-ins that serve the way TensorFlow does (on 0.0.0.0).
"""

import os
import subprocess
import sys
import time

import pytest
from network_hosts import NetworkHosts

from conftest import ROOT, OutputRun
from loops.cluster import launch

ENV = {name: value for name, value in os.environ.items() if name != "TF_CONFIG"}
ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")

# worker_0 listens on every interface on its TF_CONFIG port, as TensorFlow's server
# does; worker_1 connects to it at its TF_CONFIG address. Each says its network and
# user namespaces, then both wait for the file $DONE_FILE and exit 0.
TASK = """
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
host, port = config["cluster"]["worker"][0].rsplit(":", 1)
namespaces = " ".join(os.readlink(f"/proc/self/ns/{kind}") for kind in ("net", "user"))
if index == 0:
    server = socket.socket()
    server.bind(("0.0.0.0", int(port)))
    server.listen()
    print("listening on", port, namespaces, flush=True)
else:
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    print("reached worker_0 at", host, port, namespaces, flush=True)
while not os.path.exists(os.environ["DONE_FILE"]):
    time.sleep(0.05)
"""

# Connects to argv[1]:argv[2]; prints "connected" or the error's class name.
PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""

# Root without CAP_SYS_ADMIN: the kernel grants a network namespace only inside a
# user namespace, as it does to a user who is not root.
WITHOUT_SYS_ADMIN = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
HOST_LINE = f"[launch] this machine's network (--network=host); {launch.OPEN_SERVERS_NOTE}"
PRIVATE_LINE = f"[launch] {launch.PRIVATE_NETWORK_NOTE}"


def probe(hosts, host, address, port):
    done = subprocess.run(
        hosts.command(host, [sys.executable, "-c", PROBE, address, str(port)]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "network, prefix, reachable, user_namespace",
    [
        ("host", [], "connected", False),
        ("private", [], "ConnectionRefusedError", False),
        ("private", WITHOUT_SYS_ADMIN, "ConnectionRefusedError", True),
    ],
    ids=["host", "private", "private-in-a-user-namespace"],
)
def test_a_tasks_port_is_unreachable_from_another_network_namespace_unless_network_host(
    tmp_path, network, prefix, reachable, user_namespace
):
    done_file = tmp_path / "done"
    command = [
        *prefix,
        sys.executable,
        "-m",
        "loops.cluster.launch",
        "--num_workers=2",
        f"--network={network}",
        "--",
        sys.executable,
        "-c",
        TASK,
    ]
    started = time.monotonic()
    with NetworkHosts(2) as hosts:
        run = OutputRun(hosts.command(0, command), dict(ENV, DONE_FILE=str(done_file)))
        try:
            served = run.wait_for(r"^\[worker_0\] listening on (\d+) (\S+) (\S+)$", timeout=30)
            reached = run.wait_for(r"^\[worker_1\] reached worker_0 at 127\.0\.0\.1 (\d+) (\S+)")
            port = served.group(1)
            assert reached.group(1) == port  # the tasks reach each other on loopback
            # From the other host, at this host's address; and from this host itself.
            assert probe(hosts, 1, hosts.addresses[0], port) == reachable
            assert probe(hosts, 0, "127.0.0.1", port) == reachable
            launcher_net = os.readlink(f"/proc/{run.process.pid}/ns/net")
            launcher_user = os.readlink(f"/proc/{run.process.pid}/ns/user")
        finally:
            done_file.touch()
            code = run.finish(timeout=30)
    assert code == 0, run.output[-3000:]
    assert run.lines[0] == (HOST_LINE if network == "host" else PRIVATE_LINE)
    assert run.lines[1].startswith("[launch] starting 2 tasks: ")
    # Both tasks share one network namespace: the launcher's own, or a new one.
    assert served.group(2) == reached.group(2)
    assert (served.group(2) == launcher_net) is (network == "host")
    assert (served.group(3) != launcher_user) is user_namespace
    assert time.monotonic() - started < 60


def test_where_the_kernel_refuses_a_private_network_the_launcher_warns_and_runs_the_tasks():
    # A user namespace that may hold none, for a root without CAP_SYS_ADMIN: neither
    # way to a network namespace is open.
    refuse = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    command = [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        refuse,
        "refuse",
        *WITHOUT_SYS_ADMIN,
        sys.executable,
        "-m",
        "loops.cluster.launch",
        "--num_workers=1",
        "--",
        sys.executable,
        "-c",
        "import os; print(os.readlink('/proc/self/ns/net'))",
    ]
    started = time.monotonic()
    done = subprocess.run(command, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        "[launch] no private network (the kernel refused a network namespace: unshare: No "
        "space left on device), so the tasks use this machine's network; "
        f"{launch.OPEN_SERVERS_NOTE}"
    )
    assert done.stderr.splitlines()[-1] == "[launch] worker_0 finished"
    # The task ran in the network namespace the launcher was started in.
    assert done.stdout == f"[worker_0] {os.readlink('/proc/self/ns/net')}\n"
    assert time.monotonic() - started < 30


def test_a_launcher_asked_for_another_network_says_which_there_are():
    with pytest.raises(launch.UsageError) as raised:
        launch.Launcher([sys.executable, "-c", "pass"], launch.plan_cluster(1), network="none")
    assert str(raised.value) == (
        "--network='none' is neither private nor host; pass --network=private (the default) "
        "or --network=host."
    )
