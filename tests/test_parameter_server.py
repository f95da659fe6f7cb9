"""ParameterServerStrategy: classifier training through a ClusterCoordinator (exact mode)."""

import json
import os
import re
import sys

import pytest
from test_launch import Run, launch_in_process

import loops
from conftest import read_results as results
from loops.cluster import launch, strategies
from loops.run import parameter_server

TRAIN_STEPS = 300
MORE_STEPS = 360


def parameter_server_run(model_dir, digits_dir, train_steps):
    return [
        sys.executable,
        "-m",
        "loops.cluster.launch",
        "--num_workers=2",
        "--num_ps=1",
        "--grace_period=5",
        "--",
        "loops.bin.classifier",
        "--strategy=parameter_server",
        "--num_replicas=1",
        f"--data_dir={digits_dir}",
        f"--model_dir={model_dir}",
        f"--train_steps={train_steps}",
        "--steps_per_loop=50",
        "--global_batch_size=64",
    ]


def checkpoint_steps(model_dir):
    names = os.listdir(os.path.join(model_dir, "checkpoints"))
    return sorted(int(m.group(1)) for m in map(re.compile(r"ckpt-(\d+)\.index$").match, names) if m)


def test_two_workers_and_a_ps_train_the_classifier_and_the_chief_resumes(tmp_path, digits_dir):
    model_dir = str(tmp_path)
    run = Run(parameter_server_run(model_dir, digits_dir, TRAIN_STEPS)).succeed(timeout=300)

    # Every task ran: the servers served until the launcher stopped them after the chief.
    for task in ("worker_0", "worker_1", "ps_0"):
        address = re.search(rf"\[launch\] {task} pid \d+ at (\S+)", run.output).group(1)
        assert f"[{task}] {task} serving at grpc://{address} until stopped" in run.output
    assert "[launch] chief_0 finished" in run.output
    assert "[launch] the chief finished; stopping worker_0, worker_1, ps_0" in run.output
    # Only the chief trains the Loop and writes: its progress, eval and outputs.
    assert f"[chief_0] step {TRAIN_STEPS}/{TRAIN_STEPS} | loss" in run.output
    assert "[chief_0] outputs in" in run.output
    assert not re.search(r"\[(worker|ps)_\d\] (step|eval|outputs)", run.output)

    got = results(model_dir)
    print(
        f"parameter server: eval accuracy {got['eval']['accuracy']:.4f}, "
        f"{got['steps_per_second']:.1f} steps/s"
    )
    assert got["strategy"] == "parameter_server" and got["loop"] == "classifier"
    # The global step counts every scheduled step that completed, exactly.
    assert got["global_step"] == TRAIN_STEPS and got["preempted"] is False
    assert got["eval"]["num_examples"] == 360
    assert got["eval"]["accuracy"] >= 0.9
    assert 0.0 < got["train"]["loss"] < 0.5
    # The chief saved alone, one data shard per device holding variables: its own and the ps's.
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == [
        "checkpoint",
        f"ckpt-{TRAIN_STEPS}.data-00000-of-00002",
        f"ckpt-{TRAIN_STEPS}.data-00001-of-00002",
        f"ckpt-{TRAIN_STEPS}.index",
    ]

    # A larger --train_steps restores the chief's checkpoint and trains only the rest.
    run = Run(parameter_server_run(model_dir, digits_dir, MORE_STEPS)).succeed(timeout=300)
    assert re.search(
        rf"\[chief_0\] restored \S+ckpt-{TRAIN_STEPS} at step {TRAIN_STEPS}", run.output
    )
    assert f"[chief_0] step {MORE_STEPS}/{MORE_STEPS} | loss" in run.output
    assert f"step 50/{MORE_STEPS}" not in run.output
    resumed = results(model_dir)
    assert resumed["global_step"] == MORE_STEPS
    assert resumed["eval"]["accuracy"] >= 0.9
    assert checkpoint_steps(model_dir) == [TRAIN_STEPS, MORE_STEPS]


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
    code, _, stderr, seconds = launch_in_process(
        2,
        num_ps=1,
        roles={"chief_0": "serve", "worker_0": "serve", "worker_1": "serve", "ps_0": "exit3"},
    )
    assert code == 1
    assert "[launch] FAILED: ps_0 exited with code 3" in stderr
    assert "ps_0 exited with code 3; stopping chief_0, worker_0, worker_1" in stderr
    assert seconds < 15


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
