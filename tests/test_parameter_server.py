"""ParameterServerStrategy: classifier training through a ClusterCoordinator (exact mode),
preempted and rerun, losing a worker, to one process's weights."""

import json
import os
import re
import signal
import sys
import time

import pytest
from test_launch import ENV, Run, largest_weight_difference, launch_in_process

import loops
from conftest import read_results as results
from loops.cluster import launch, parameter_server, strategies
from loops.vocabulary import exit_codes

TRAIN_STEPS = 120
# A checkpoint's files: one data shard per device holding variables (the chief's, the ps').
SHARDS = ("data-00000-of-00002", "data-00001-of-00002", "index")


def classifier(*flags, model_dir, digits_dir):
    return [
        "loops.bin.classifier",
        *flags,
        f"--data_dir={digits_dir}",
        f"--model_dir={model_dir}",
        f"--train_steps={TRAIN_STEPS}",
        "--steps_per_loop=20",
        "--global_batch_size=64",
    ]


def parameter_server_run(model_dir, digits_dir):
    launcher = ["-m", "loops.cluster.launch", "--num_workers=2", "--num_ps=1", "--grace_period=5"]
    flags = ("--strategy=parameter_server", "--num_replicas=1")
    return [
        sys.executable,
        *launcher,
        "--",
        *classifier(*flags, model_dir=model_dir, digits_dir=digits_dir),
    ]


def checkpoint_steps(model_dir):
    names = os.listdir(os.path.join(model_dir, "checkpoints"))
    return sorted(int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)\.index$").match, names) if m)


def test_a_sigterm_to_the_chief_saves_and_exits_42_and_the_rerun_survives_a_killed_worker(
    tmp_path, digits_dir
):
    model_dir, one_process_dir = str(tmp_path / "cluster"), str(tmp_path / "one")
    # One process trains the same run meanwhile, as the reference.
    flags = classifier("--strategy=default", model_dir=one_process_dir, digits_dir=digits_dir)
    one_process = Run([sys.executable, "-m", *flags])
    run = Run(parameter_server_run(model_dir, digits_dir))
    chief = int(run.wait_for(r"\[launch\] chief_0 pid (\d+)").group(1))
    run.wait_for(r"\[chief_0\] step 40/")
    os.kill(chief, signal.SIGTERM)
    signalled = time.monotonic()
    # The chief saves at the next boundary and exits 42, which the launcher passes on.
    assert run.finish(timeout=120) == exit_codes.PREEMPTED, run.output[-4000:]
    print(f"the chief exited 42 {time.monotonic() - signalled:.1f} s after its SIGTERM")
    preempted_at = int(run.wait_for(r"\[chief_0\] preempted \(SIGTERM\) at step (\d+)").group(1))
    assert 40 <= preempted_at < TRAIN_STEPS and preempted_at % 20 == 0
    assert results(model_dir)["preempted"] is True
    assert results(model_dir)["global_step"] == preempted_at
    assert checkpoint_steps(model_dir) == [preempted_at]

    # The same command restores the chief's checkpoint and trains only the rest; worker_1
    # is killed as it starts: the launcher says so and the run goes on without it. Run as a
    # user runs it, without the tests' TF_CPP_MIN_LOG_LEVEL=2 (which shows TensorFlow's C++
    # errors, each lost remote function among them).
    quiet = {name: value for name, value in ENV.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    run = Run(parameter_server_run(model_dir, digits_dir), env=quiet)
    worker_1 = int(run.wait_for(r"\[launch\] worker_1 pid (\d+)").group(1))
    run.wait_for(r"\[chief_0\] restored ")
    os.kill(worker_1, signal.SIGKILL)
    run.succeed(timeout=300)
    one_process.succeed(timeout=300)
    assert (
        "[launch] worker_1 was killed by SIGKILL; the run goes on: under parameter servers the "
        "chief computes its share of each step on the other workers"
    ) in run.output
    # The chief says it in one line, without TensorFlow's GRPC details.
    assert re.search(
        r"\[chief_0\] .*lost worker_1: it stopped answering \(its process died or its host went "
        r"down\); training goes on, its closures run on the other workers$",
        run.output,
        re.MULTILINE,
    ), run.output[-4000:]
    assert "GRPC" not in run.output and "remote target" not in run.output
    assert re.search(
        rf"\[chief_0\] restored \S+ckpt-{preempted_at} at step {preempted_at}", run.output
    )
    assert f"[chief_0] step {TRAIN_STEPS}/{TRAIN_STEPS} | loss" in run.output
    assert f"step 20/{TRAIN_STEPS}" not in run.output
    # Every task ran: the servers served until the launcher stopped them after the chief.
    for task in ("worker_0", "worker_1", "ps_0"):
        address = re.search(rf"\[launch\] {task} pid \d+ at (\S+)", run.output).group(1)
        assert f"[{task}] {task} serving at grpc://{address} until stopped" in run.output
    assert "[launch] the chief finished; stopping worker_0, ps_0" in run.output
    # Only the chief trains the Loop and writes: its progress, eval and outputs.
    assert "[chief_0] outputs in" in run.output
    assert not re.search(r"\[(worker|ps)_\d\] (step|eval|outputs)", run.output)
    got = results(model_dir)
    assert got["strategy"] == "parameter_server" and got["loop"] == "classifier"
    assert got["global_step"] == TRAIN_STEPS and got["preempted"] is False
    assert got["parameter_server"]["mode"] == "exact"
    assert got["parameter_server"]["scheduled_closures"] == 2 * (TRAIN_STEPS - preempted_at)
    # The chief saved alone, at the preemption and at the end.
    saved = [f"ckpt-{step}.{part}" for step in (preempted_at, TRAIN_STEPS) for part in SHARDS]
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == sorted(
        ["checkpoint", *saved]
    )
    # Preempted and rerun losing a worker, the weights (Adam's slots too) and eval of one
    # process.
    difference = largest_weight_difference(model_dir, one_process_dir)
    reference = results(one_process_dir)
    print(
        f"parameter server, preempted at {preempted_at} and rerun losing worker_1: eval accuracy "
        f"{got['eval']['accuracy']:.4f}, largest relative weight difference to one process "
        f"{difference:.2g}"
    )
    assert difference <= 1e-5
    assert got["eval"]["num_examples"] == reference["eval"]["num_examples"] == 360
    assert abs(got["eval"]["accuracy"] - reference["eval"]["accuracy"]) < 1e-6
    assert got["eval"]["accuracy"] >= 0.8
    assert 0.0 < got["train"]["loss"] < 1.0


def test_a_cluster_with_parameter_servers_gets_a_chief():
    tasks = launch.plan_cluster(2, num_ps=1)
    assert [task.name for task in tasks] == ["chief_0", "worker_0", "worker_1", "ps_0"]
    addresses = [task.address for task in tasks]
    assert len(set(addresses)) == 4
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", address) for address in addresses)
    for task in tasks:
        config = json.loads(launch.tf_config(tasks, task))
        assert config["cluster"] == {
            "chief": addresses[:1],
            "worker": addresses[1:3],
            "ps": addresses[3:],
        }
        assert config["task"] == {"type": task.type, "index": task.index}
    # Without parameter servers worker_0 stays the chief, as before.
    assert [task.name for task in launch.plan_cluster(2)] == ["worker_0", "worker_1"]


def test_the_launcher_ends_with_the_chief_and_stops_the_servers():
    code, stdout, stderr, seconds = launch_in_process(
        2, num_ps=1, roles={"worker_0": "serve", "worker_1": "serve", "ps_0": "serve"}
    )
    assert code == 0, stderr
    assert "[chief_0] task " in stdout
    assert "[launch] chief_0 finished" in stderr
    assert "[launch] the chief finished; stopping worker_0, worker_1, ps_0" in stderr
    assert seconds < 15


def test_a_server_dying_before_the_chief_fails_the_run_naming_it():
    code, stdout, stderr, seconds = launch_in_process(
        2,
        num_ps=1,
        roles={
            "chief_0": "preempted",
            "worker_0": "graceful",
            "worker_1": "graceful",
            "ps_0": "exit3",
        },
    )
    assert code == 1
    assert "[launch] FAILED: ps_0 exited with code 3" in stderr
    assert (
        "[launch] ps_0 exited with code 3; stopping chief_0 first (its save reads the servers' "
        "variables), then worker_0, worker_1 (SIGTERM, then SIGKILL after 1 s)"
    ) in stderr
    # The chief's save runs while the workers still serve; they are stopped after it.
    assert "[chief_0] others got SIGTERM while saving: []" in stdout
    assert "[worker_0] got SIGTERM" in stdout and "[worker_1] got SIGTERM" in stdout
    assert seconds < 15


def test_a_lost_worker_of_a_chief_is_survived_and_the_last_one_fails_the_run():
    # worker_1 exits 3 while the chief trains (it exits 0 a second after every task is ready).
    code, _, stderr, _ = launch_in_process(
        2,
        num_ps=1,
        roles={"chief_0": "saving0", "worker_0": "serve", "worker_1": "exit3", "ps_0": "serve"},
    )
    assert code == 0, stderr
    assert (
        "[launch] worker_1 exited with code 3; the run goes on: under parameter servers the "
        "chief computes its share of each step on the other workers\n"
    ) in stderr
    assert "[launch] the chief finished; stopping worker_0, ps_0\n" in stderr
    assert "FAILED" not in stderr
    # Its only worker lost, the chief cannot go on: stopped first, saving, then its server.
    code, stdout, stderr, _ = launch_in_process(
        1, num_ps=1, roles={"chief_0": "preempted", "worker_0": "exit3", "ps_0": "graceful"}
    )
    assert code == 1
    assert (
        "[launch] worker_0 exited with code 3; stopping chief_0 first (its save reads the "
        "servers' variables), then ps_0 (SIGTERM, then SIGKILL after 1 s)\n"
    ) in stderr
    assert "[chief_0] others got SIGTERM while saving: []" in stdout
    assert "[ps_0] got SIGTERM" in stdout
    assert stderr.endswith("[launch] FAILED: worker_0 exited with code 3\n")


def tf_config(cluster, task_type="chief"):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": 0}})


def test_a_cluster_without_a_chief_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG", tf_config({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "worker")
    )
    with pytest.raises(
        ValueError,
        match=r"needs exactly one 'chief' task in TF_CONFIG .* got "
        r"chief=\[\]\. Pass --num_ps to loops-launch",
    ):
        parameter_server.serve_unless_chief()


def test_a_task_of_another_type_is_refused(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        tf_config(
            {
                "chief": ["127.0.0.1:1"],
                "worker": ["127.0.0.1:2"],
                "ps": ["127.0.0.1:3"],
                "evaluator": ["127.0.0.1:4"],
            },
            "evaluator",
        ),
    )
    with pytest.raises(
        ValueError,
        match="runs tasks of type chief, worker or ps; TF_CONFIG names this task 'evaluator'",
    ):
        parameter_server.serve_unless_chief()


def test_the_chief_goes_on_to_train(monkeypatch):
    # Free ports: the chief's own port is checked to be free before any work.
    chief, worker, ps = (f"127.0.0.1:{port}" for port in launch.free_ports(3))
    monkeypatch.setenv("TF_CONFIG", tf_config({"chief": [chief], "worker": [worker], "ps": [ps]}))
    assert parameter_server.serve_unless_chief() is None
    assert strategies.cluster_resolver("parameter_server").task_type == "chief"


def test_loops_whose_steps_need_synchronous_replicas_refuse_parameter_server():
    # Only the strategy's class name decides; a real one would connect to a cluster.
    strategy = type("ParameterServerStrategyV2", (), {})()
    with pytest.raises(
        ValueError,
        match="Loop does not train under ParameterServerStrategy .* "
        "Use --strategy=multi_worker_mirrored or mirrored",
    ):
        loops.Trainer(loops.Loop(), strategy=strategy)
    assert loops.ClassifierLoop.supports_parameter_server
