"""Runs a command as a local tf.distribute cluster, one process per task: `loops-launch`.

    loops-launch --num_workers=2 -- loops.bin.classifier \\
        --strategy=multi_worker_mirrored --model_dir=/tmp/run1
    loops-launch --num_workers=2 --num_ps=1 -- loops.bin.classifier \\
        --strategy=parameter_server --model_dir=/tmp/run2
    loops-launch --num_workers=2 --evaluator -- loops.bin.classifier \\
        --strategy=multi_worker_mirrored --model_dir=/tmp/run3

Every task gets a TF_CONFIG naming the whole cluster (free 127.0.0.1 ports) and
its own task, and every line it prints comes out prefixed with its name
(`[worker_0] ...`). With --num_ps the cluster also has a `chief` task (the
coordinator of ParameterServerStrategy). With --evaluator one more process
runs the same command as task `evaluator` (TensorFlow's convention: its
TF_CONFIG names the cluster, which does not list it, so the training tasks
never wait for it); a loops binary then evaluates the run's checkpoints as
they appear (--mode=evaluate_checkpoints).

The run ends with the chief, or without one with the last worker; then the
launcher stops the tasks still running (parameter servers, and the workers of
a chief, never exit on their own) and waits for the evaluator to handle the
run's last checkpoint. Its exit code (loops/vocabulary/exit_codes.py):
0 when they all exited 0; 42 (PREEMPTED) when some exited 42, a preempted
run that saved every completed step (rerun the same command to continue); 1
as soon as a training task exits with any other code, after stopping the
others (a chief first, then its workers and servers, which its save and its
step in progress need) and naming that task. A worker of a chief is the
exception: ParameterServerStrategy's coordinator runs its closures on the
other workers, so its exit is said in one line and the run goes on while
another worker runs. A task exiting 42 is not a failure: the others
were preempted too and are saving, so they are left to finish. An evaluator
that fails is named and training goes on; the launcher then exits 1 once
training has finished (42 if it was preempted).

SIGINT and SIGTERM it receives go to the chief, or without one to every
worker, and to the evaluator (a loops binary saves a checkpoint on SIGTERM
and, under MultiWorkerMirroredStrategy, tells the other workers); the servers
keep serving until the chief is done, since its checkpoint reads the
variables they hold. A second signal kills every task.

The tasks run in a network namespace of their own with only loopback
(`private_network`), where the kernel allows one: TensorFlow's servers listen
on every interface without authentication, and there nothing outside reaches
them. The launcher's first line says which network the tasks have;
--network=host gives them this machine's, for commands that need other hosts.

The tasks are plain subprocesses watched by threads, not TensorFlow's
multi-process test runner (BUILD.md fact 15).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

from loops.cluster import templates
from loops.cluster.private_network import NetworkRefused, PrivateNetwork
from loops.cluster.scheduler_cluster import DEFAULT_KUBERNETES_PORT, FOUND_BY_VARIABLE
from loops.vocabulary import exit_codes

HOST = "127.0.0.1"
EXAMPLE = "loops-launch --num_workers=2 -- loops.bin.classifier --strategy=multi_worker_mirrored"
# A dotted Python module path such as `loops.bin.classifier`.
_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_POLL_SECONDS = 0.05


EVALUATOR = "evaluator"  # the task type of TensorFlow's evaluator beside a cluster
# TensorFlow's gRPC server binds "0.0.0.0:PORT" (grpc_server_lib.cc; ServerDef
# has a port but no host) and takes no credentials, so 127.0.0.1 addresses do
# not keep a cluster's servers to this machine.
OPEN_SERVERS_NOTE = (
    "note: the tasks' TensorFlow servers listen on every network interface of this machine, "
    "not only 127.0.0.1 (TensorFlow has no setting to bind them to one), and accept anyone "
    "without authentication: whoever reaches their ports can run operations as this user. "
    "Run clusters only on machines whose ports are closed to untrusted networks (a firewall "
    "or a private network)."
)
# --network: the tasks' own namespace with only loopback, or this machine's network.
NETWORKS = ("private", "host")
PRIVATE_NETWORK_NOTE = (
    "private network: the tasks run in a network namespace of their own with only loopback, "
    "so nothing outside it reaches their TensorFlow servers (which accept anyone who does), "
    "and the tasks reach no other host; pass --network=host if the command needs this "
    "machine's network"
)


@dataclasses.dataclass
class Task:
    """One process of the cluster."""

    type: str  # "chief", "worker", "ps" or "evaluator"
    index: int
    address: str | None  # host:port this task serves on; None for the evaluator
    process: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"{self.type}_{self.index}"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def started(self) -> subprocess.Popen:
        """The task's process; only asked for once every task has started."""
        if self.process is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self.process


class UsageError(ValueError):
    """A launcher flag or the command is wrong; the message says how to fix it."""


def free_ports(count: int, host: str = HOST) -> list[int]:
    """Returns `count` distinct ports that were free on `host` a moment ago.

    All sockets stay bound until every port is read back, so the kernel
    cannot hand out the same port twice. Another process could still take one
    before the task binds it; a collision then fails that task loudly.
    """
    sockets = []
    try:
        for _ in range(count):
            bound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            bound.bind((host, 0))
            sockets.append(bound)
        return [bound.getsockname()[1] for bound in sockets]
    finally:
        for bound in sockets:
            bound.close()


def check_counts(num_workers: int, num_ps: int) -> None:
    """Raises UsageError unless num_workers >= 1 and num_ps >= 0."""
    if num_workers < 1:
        raise UsageError(
            f"--num_workers={num_workers}: a cluster needs at least one worker; pass "
            "--num_workers=2 (or more) for a multi-worker run."
        )
    if num_ps < 0:
        raise UsageError(f"--num_ps={num_ps} is negative; pass --num_ps=0 (the default) or more.")


def plan_cluster(
    num_workers: int, num_ps: int = 0, host: str = HOST, *, evaluator: bool = False
) -> list[Task]:
    """The tasks of a local cluster with `num_workers` workers and `num_ps` parameter servers.

    With parameter servers the cluster also gets a `chief` task, the
    coordinator that ParameterServerStrategy needs (the workers and parameter
    servers only serve it). Without, worker_0 is the chief. With `evaluator`,
    an `evaluator` task comes last: it serves nothing, so it has no address.

    Raises:
        UsageError: num_workers < 1 or num_ps < 0.
    """
    check_counts(num_workers, num_ps)
    counts = {"chief": 1 if num_ps else 0, "worker": num_workers, "ps": num_ps}
    ports = iter(free_ports(sum(counts.values()), host))
    tasks = [
        Task(task_type, index, f"{host}:{next(ports)}")
        for task_type, count in counts.items()
        for index in range(count)
    ]
    return tasks + ([Task(EVALUATOR, 0, None)] if evaluator else [])


def tf_config(tasks: Sequence[Task], task: Task) -> str:
    """The TF_CONFIG JSON for `task` in the cluster `tasks`.

    The cluster lists the tasks that serve (not the evaluator), so every task,
    the evaluator too, sees the same cluster.
    """
    cluster: dict[str, list[str]] = {}
    for member in tasks:
        if member.address is not None:
            cluster.setdefault(member.type, []).append(member.address)
    return json.dumps({"cluster": cluster, "task": {"type": task.type, "index": task.index}})


def resolve_command(words: Sequence[str]) -> list[str]:
    """The argv to run: `words` as given if it names a program, else `python -m words...`.

    The first word is a program when it is a path (holds a `/`) or is found on
    PATH; otherwise it must be a dotted module path such as
    `loops.bin.classifier`, run with this Python.

    Raises:
        UsageError: no words, or a first word that is neither.
    """
    if not words:
        raise UsageError(f"No command after `--`; put the module or command there, e.g. {EXAMPLE}")
    first = words[0]
    if os.sep in first or shutil.which(first):
        return list(words)
    if first.endswith(".py"):
        raise UsageError(
            f"{first!r} looks like a script file; pass `python {first}` to run it as a "
            f"command, or its module path ({first[:-3].replace(os.sep, '.')}) to run it with -m."
        )
    if not _MODULE_PATH.fullmatch(first):
        raise UsageError(
            f"{first!r} is neither a program on PATH nor a Python module path like "
            "loops.bin.classifier; pass one of those after `--`."
        )
    return [sys.executable, "-m", *words]


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


try:
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
except (ImportError, OSError, AttributeError):
    _prctl = None


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the launcher dies (Linux only).

    Without it a launcher killed with SIGKILL leaves its workers running,
    still holding their ports and the model_dir lock.
    """
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _prepare_task(network: PrivateNetwork | None) -> None:
    """In the child before exec: die with the launcher, and join the private network."""
    _die_with_parent()
    if network is not None:
        network.join()


def open_network(network: str) -> tuple[PrivateNetwork | None, str]:
    """The private network the tasks join (None: this machine's) and the line that says so.

    `network` is "private" or "host" (--network); where the kernel refuses a
    private one, the tasks get this machine's network and the line says why.
    """
    if network == "host":
        return None, f"this machine's network (--network=host); {OPEN_SERVERS_NOTE}"
    try:
        return PrivateNetwork.create(), PRIVATE_NETWORK_NOTE
    except NetworkRefused as refused:
        return None, (
            f"no private network ({refused}), so the tasks use this machine's network; "
            f"{OPEN_SERVERS_NOTE}"
        )


def survivable_loss(task: Task, tasks: Sequence[Task]) -> bool:
    """Whether the run of `tasks` survives `task` exiting: a worker of a chief (parameter
    servers) while another worker still runs. The chief's coordinator runs a lost worker's
    closures on the others; a worker of MultiWorkerMirroredStrategy is a peer in every
    collective, so its loss is the run's."""
    if task.type != "worker" or not any(other.type == "chief" for other in tasks):
        return False
    return any(other.type == "worker" and other.running() for other in tasks)


def stop_order(tasks: Sequence[Task]) -> tuple[list[Task], list[Task]]:
    """`tasks` split into those to stop first and those to stop once they have exited.

    A chief's checkpoint reads the variables its parameter servers hold, and its step in
    progress needs its workers: it is stopped (and saves) first, the evaluator with it,
    the workers and servers after. Without a chief every task is stopped at once.
    """
    if not any(task.type == "chief" for task in tasks):
        return [], list(tasks)
    first = [task for task in tasks if task.type in ("chief", EVALUATOR)]
    return first, [task for task in tasks if task not in first]


def _in_order(first: Sequence[Task], then: Sequence[Task]) -> str:
    """Names the tasks `stop_order` split, saying which go first where some do."""
    if not first or not then:
        return ", ".join(task.name for task in [*first, *then])
    return (
        f"{', '.join(task.name for task in first)} first (its save reads the servers' "
        f"variables), then {', '.join(task.name for task in then)}"
    )


class Launcher:
    """Starts a cluster's tasks, prefixes their output, and supervises them.

    Args:
        command: the argv every task runs (see `resolve_command`).
        tasks: the cluster (see `plan_cluster`).
        grace_period: seconds a task has to exit after SIGTERM before SIGKILL.
        stdout, stderr: where the tasks' prefixed lines go; the launcher's own
            lines (`[launch] ...`) go to stderr.
        env: the tasks' environment (this process's if None), plus TF_CONFIG.
        network: "private" (the tasks' own loopback-only network namespace, where the
            kernel allows one) or "host" (this machine's network).
    """

    def __init__(
        self,
        command: Sequence[str],
        tasks: Sequence[Task],
        *,
        grace_period: float = 10.0,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        env: dict[str, str] | None = None,
        network: str = "private",
    ):
        if not grace_period > 0:
            raise UsageError(f"--grace_period={grace_period} must be > 0 seconds, e.g. 10.")
        if network not in NETWORKS:
            raise UsageError(
                f"--network={network!r} is neither private nor host; pass --network=private "
                "(the default) or --network=host."
            )
        self.network = network
        self._private_network: PrivateNetwork | None = None
        self.command = list(command)
        self.tasks = list(tasks)
        self.grace_period = grace_period
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._env = dict(os.environ if env is None else env)
        self._write_lock = threading.Lock()
        self._pumps: list[threading.Thread] = []
        self._signals: list[int] = []  # received, in order
        self._signals_told = 0  # how many of them `say` has reported

    def run(self) -> int:
        """Runs the tasks to the end; returns the launcher's exit code."""
        previous = self._forward_signals()
        try:
            self._start()
            return self._supervise()
        finally:
            # Whatever ended the wait (an error in the launcher included), no task outlives it.
            for tasks in stop_order([task for task in self.tasks if task.running()]):
                self._stop(tasks)
            for pump in self._pumps:
                pump.join(timeout=5)
            if self._private_network is not None:
                self._private_network.close()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def say(self, text: str) -> None:
        """Writes one launcher line to stderr."""
        self._write(self._stderr, f"[launch] {text}\n")

    # ---- Starting. ----

    def _start(self) -> None:
        self._private_network, network_line = open_network(self.network)
        self.say(network_line)
        self.say(f"starting {len(self.tasks)} tasks: {shlex.join(self.command)}")
        for task in self.tasks:
            env = dict(self._env, TF_CONFIG=tf_config(self.tasks, task), PYTHONUNBUFFERED="1")
            # The cluster is this TF_CONFIG, not one the launcher's own process found.
            env.pop(FOUND_BY_VARIABLE, None)
            try:
                task.process = subprocess.Popen(
                    self.command,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # Its own session: a terminal's Ctrl-C reaches the tasks only
                    # through the launcher, once, instead of twice.
                    start_new_session=True,
                    preexec_fn=functools.partial(_prepare_task, self._private_network),
                )
            except OSError as error:
                raise UsageError(
                    f"Cannot start {self.command[0]!r} for {task.name} ({error}); check that "
                    "the path exists and is executable."
                ) from error
            except subprocess.SubprocessError as error:  # raised by _prepare_task: setns
                raise UsageError(
                    f"Cannot start {task.name} in the private network ({error}); pass "
                    "--network=host to run the tasks in this machine's network."
                ) from error
            where = f" at {task.address}" if task.address else ""
            self.say(f"{task.name} pid {task.process.pid}{where}")
        # The readers start only after every fork: a fork while other threads run
        # could copy a lock they hold into the child before exec.
        for task in self.tasks:
            for source, sink in (
                (task.started.stdout, self._stdout),
                (task.started.stderr, self._stderr),
            ):
                pump = threading.Thread(
                    target=self._pump,
                    args=(source, sink, f"[{task.name}] "),
                    name=f"launch-{task.name}",
                    daemon=True,
                )
                pump.start()
                self._pumps.append(pump)

    def _pump(self, source, sink: TextIO, prefix: str) -> None:
        with source:
            for raw in iter(source.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self._write(sink, f"{prefix}{line}\n")

    def _write(self, sink: TextIO, text: str) -> None:
        with self._write_lock:
            sink.write(text)
            sink.flush()

    # ---- Supervising. ----

    def _leaders(self) -> list[Task]:
        """The tasks the run ends with: the chief if there is one, else every worker."""
        chiefs = [task for task in self.tasks if task.type == "chief"]
        return chiefs or [task for task in self.tasks if task.type == "worker"]

    def _evaluators(self) -> list[Task]:
        return [task for task in self.tasks if task.type == EVALUATOR]

    def _supervise(self) -> int:
        leaders = self._leaders()
        ended = "the chief finished" if leaders[0].type == "chief" else "every worker finished"
        reported: set[str] = set()
        preempted: set[str] = set()
        failed_evaluator: str | None = None  # why, once an evaluator failed
        training_ended = False
        while True:
            self._tell_signals()
            for task in self.tasks:
                code = task.started.poll()
                if code is None or task.name in reported:
                    continue
                reported.add(task.name)
                if code == exit_codes.PREEMPTED:
                    preempted.add(task.name)
                    self.say(f"{task.name} was preempted (exit code {code}) and saved")
                elif code != 0 and task.type == EVALUATOR:
                    # Evaluation must never stop training: name it, go on.
                    failed_evaluator = f"{task.name} {_describe_exit(code)}"
                    self.say(f"{failed_evaluator}; training goes on without it")
                elif code != 0 and survivable_loss(task, self.tasks):
                    self.say(
                        f"{task.name} {_describe_exit(code)}; the run goes on: under parameter "
                        "servers the chief computes its share of each step on the other workers"
                    )
                elif code != 0:
                    return self._fail(task, code)
                else:
                    self.say(f"{task.name} finished")
            if not training_ended and all(leader.name in reported for leader in leaders):
                training_ended = True
                servers = [task for task in self.tasks if task.running()]
                # After a preemption or a signal there is no last checkpoint to wait for.
                waiting = [] if preempted or self._signals else self._evaluators()
                servers = [task for task in servers if task not in waiting]
                if servers:
                    self.say(f"{ended}; stopping " + ", ".join(task.name for task in servers))
                    self._stop(servers)
                    # Stopped by the launcher: no failure to report while an evaluator runs.
                    reported.update(task.name for task in servers)
                still = [task.name for task in waiting if task.running()]
                if still:
                    self.say(
                        f"{ended}; waiting for {', '.join(still)} to evaluate the run's "
                        "last checkpoints"
                    )
            if training_ended and not any(task.running() for task in self._evaluators()):
                return self._outcome(ended, preempted, failed_evaluator)
            time.sleep(_POLL_SECONDS)

    def _outcome(self, ended: str, preempted: set[str], failed_evaluator: str | None) -> int:
        """The exit code once training has ended and no evaluator runs; says it."""
        after = f" after {self._signal_names()}" if self._signals else ""
        if preempted:
            named = ", ".join(task.name for task in self.tasks if task.name in preempted)
            self.say(
                f"PREEMPTED{after}: {named} exited "
                f"{exit_codes.PREEMPTED}; rerun the same command to continue "
                f"(exit code {exit_codes.PREEMPTED})"
            )
            return exit_codes.PREEMPTED
        if failed_evaluator is not None:
            self.say(f"FAILED: {failed_evaluator} (training finished){after}")
            return 1
        if self._signals:
            self.say(f"{ended}{after}")
        return exit_codes.FINISHED

    def _fail(self, task: Task, code: int) -> int:
        self._tell_signals()
        reason = f"{task.name} {_describe_exit(code)}"
        after = f" after {self._signal_names()}" if self._signals else ""
        first, then = stop_order([other for other in self.tasks if other.running()])
        if first or then:
            self.say(
                f"{reason}{after}; stopping {_in_order(first, then)} "
                f"(SIGTERM, then SIGKILL after {self.grace_period:g} s)"
            )
            self._stop(first)
            self._stop(then)
        self.say(f"FAILED: {reason}{after}")
        return 128 + self._signals[0] if self._signals else 1

    def _stop(self, tasks: Sequence[Task]) -> None:
        """SIGTERM to `tasks`, SIGKILL to those still running after the grace period."""
        for task in tasks:
            self._send(task, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        while any(task.running() for task in tasks) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        for task in tasks:
            if task.running():
                self.say(
                    f"{task.name} still running {self.grace_period:g} s after SIGTERM; "
                    "sending SIGKILL"
                )
                self._send(task, signal.SIGKILL)
                task.started.wait()

    @staticmethod
    def _send(task: Task, signum: int) -> None:
        try:
            task.started.send_signal(signum)
        except ProcessLookupError:
            pass  # it exited between the check and the signal

    def _forward_signals(self) -> dict[int, Any]:
        """Installs SIGINT/SIGTERM/SIGUSR1 forwarding; returns the handlers it replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}  # only the main thread may install handlers
        return {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
        }

    def _on_signal(self, signum: int, frame) -> None:
        # No output here: the handler can interrupt a write to the same stream,
        # which Python refuses ("reentrant call"). The supervising loop reports it.
        del frame
        self._signals.append(signum)
        index = len(self._signals) - 1
        for task in self._signalled(index):
            if task.running():
                self._send(task, self._forwarded(index))

    def _forwarded(self, index: int) -> int:
        # A second signal means the user will not wait for a clean stop.
        return self._signals[index] if index == 0 else signal.SIGKILL

    def _signalled(self, index: int) -> list[Task]:
        # The first signal goes to the tasks the run ends with and the evaluator,
        # sparing the servers of a chief: a parameter server dies on SIGTERM, and
        # the chief's checkpoint reads its variables.
        return self._leaders() + self._evaluators() if index == 0 else self.tasks

    def _tell_signals(self) -> None:
        while self._signals_told < len(self._signals):
            index = self._signals_told
            self._signals_told += 1
            targets = self._signalled(index)
            to = "every task"
            if len(targets) < len(self.tasks):
                to = (
                    ", ".join(task.name for task in targets)
                    + " (the others keep serving until the run ends)"
                )
            self.say(
                f"received {signal.Signals(self._signals[index]).name}; sent "
                f"{signal.Signals(self._forwarded(index)).name} to {to}"
            )

    def _signal_names(self) -> str:
        return " and ".join(signal.Signals(signum).name for signum in self._signals)


# --help's last part: an example, the exit codes and where signals go.
_EPILOG = (
    f"example: {EXAMPLE} --model_dir=/tmp/run1\n\n"
    "exit codes:\n"
    f"  {exit_codes.FINISHED:<5} every task finished\n"
    f"  {exit_codes.PREEMPTED:<5} preempted: tasks exited {exit_codes.PREEMPTED} after "
    "saving; rerun the same command to continue\n"
    "  1     a task failed (the last line names it); the others were stopped (a\n"
    "        failed evaluator: once training finished; a worker of a chief: only\n"
    "        when it was the last)\n"
    "  2     bad launcher arguments\n"
    "  128+N a task failed after the launcher received signal N\n\n"
    "SIGINT and SIGTERM go to the chief (without one, to every worker) and the\n"
    "evaluator; the servers keep serving until it ends. A second signal kills\n"
    "every task."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loops-launch",
        allow_abbrev=False,
        usage="%(prog)s --num_workers=N [--num_ps=M] [--evaluator] [--grace_period=S] "
        "[--network=private|host] -- <module or command> [its flags]",
        description="Runs a command as a local tf.distribute cluster: one process per task, "
        "each with TF_CONFIG set, output lines prefixed with the task name.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_EPILOG,
    )
    # Checked in main, after unknown flags, so a misspelled --num_workers is named as such.
    parser.add_argument(
        "--num_workers",
        type=int,
        help="worker processes, >= 1 (worker_0 is the chief unless --num_ps adds one); required",
    )
    parser.add_argument(
        "--num_ps",
        type=int,
        default=0,
        help="parameter-server processes (default 0); with any, a chief task "
        "(the coordinator of --strategy=parameter_server) starts too",
    )
    parser.add_argument(
        "--evaluator",
        action="store_true",
        help="also run the command as task 'evaluator' (not in the training cluster): a "
        "loops binary there evaluates each checkpoint of the run in its --model_dir as it "
        "appears (--mode=evaluate_checkpoints); the launcher waits for it after training",
    )
    parser.add_argument(
        "--grace_period",
        type=float,
        default=10.0,
        help="seconds a task has to exit after SIGTERM before SIGKILL (default 10)",
    )
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        default="private",
        help="private (default): the tasks run in a network namespace of their own with only "
        "loopback, unreachable from outside, where the kernel allows one (else a warning); "
        "host: in this machine's network, for commands that need other hosts",
    )
    _add_template_arguments(parser)
    return parser


def _add_template_arguments(parser: argparse.ArgumentParser) -> None:
    template = parser.add_argument_group(
        "templates (print instead of running: the cluster is the scheduler's)"
    )
    template.add_argument(
        "--print",
        choices=templates.TEMPLATES,
        help="write to stdout an sbatch script (slurm) or a Kubernetes Service and Indexed "
        "Job (kubernetes, JSON for kubectl apply -f) that run the command on --num_workers "
        "tasks (and --num_ps servers and a chief), requeued when preempted",
    )
    template.add_argument("--job_name", default="loops", help="the job's name (default loops)")
    template.add_argument(
        "--image", help="--print=kubernetes: the container image the tasks run (required)"
    )
    template.add_argument(
        "--port",
        type=int,
        default=DEFAULT_KUBERNETES_PORT,
        help=f"--print=kubernetes: the port every pod serves on (default "
        f"{DEFAULT_KUBERNETES_PORT})",
    )


def template_command(words: Sequence[str]) -> list[str]:
    """The command a template runs on the cluster's hosts: a dotted module path runs
    with `python3 -m` there, anything else as given.

    Raises:
        UsageError: no words.
    """
    if not words:
        raise UsageError(f"No command after `--`; put the module or command there, e.g. {EXAMPLE}")
    first = words[0]
    if "." in first and not first.endswith(".py") and _MODULE_PATH.fullmatch(first):
        return ["python3", "-m", *words]
    return list(words)


def print_template(options: argparse.Namespace, words: Sequence[str]) -> str:
    """The template --print asks for.

    Raises:
        UsageError: a flag the template cannot honour, or a missing one.
    """
    check_counts(options.num_workers, options.num_ps)
    if options.evaluator:
        raise UsageError(
            "--evaluator starts a process beside a local cluster; a template has none: run "
            "the evaluator as its own job (--mode=evaluate_checkpoints on the same model_dir)."
        )
    command = template_command(words)
    if options.print == "kubernetes" and not options.image:
        raise UsageError(
            "--print=kubernetes needs --image: the container image, with loops installed, "
            "that the tasks run (e.g. --image=registry.example.com/loops:1)."
        )
    try:
        if options.print == "slurm":
            return templates.slurm_script(
                command, options.num_workers, options.num_ps, job_name=options.job_name
            )
        return templates.kubernetes_manifest(
            command,
            options.num_workers,
            options.num_ps,
            job_name=options.job_name,
            image=options.image,
            port=options.port,
        )
    except templates.TemplateValueError as error:
        raise UsageError(str(error)) from error


def main(argv: Sequence[str]) -> int:
    """Parses `argv` (without the program name), runs the cluster, returns the exit code."""
    argv = list(argv)
    parser = _parser()
    split = argv.index("--") if "--" in argv else len(argv)
    own, words = argv[:split], argv[split + 1 :]
    options, unknown = parser.parse_known_args(own)
    if unknown:
        parser.error(
            f"unexpected {' '.join(unknown)}; the launcher takes --num_workers, "
            "--num_ps, --evaluator, --grace_period, --network and the template flags (--help), "
            "and the command goes after `--`, "
            f"e.g. {EXAMPLE}"
        )
    if options.num_workers is None:
        parser.error(
            f"--num_workers is required: how many worker processes to start, e.g. {EXAMPLE}"
        )
    if split == len(argv):
        parser.error(f"no `--` and no command after it; e.g. {EXAMPLE}")
    try:
        if options.print:
            print(print_template(options, words), end="")
            return 0
        command = resolve_command(words)
        launcher = Launcher(
            command,
            plan_cluster(options.num_workers, options.num_ps, evaluator=options.evaluator),
            grace_period=options.grace_period,
            network=options.network,
        )
        return launcher.run()
    except UsageError as error:
        parser.error(str(error))


def run() -> None:
    """Console-script entry point (loops-launch)."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run()
