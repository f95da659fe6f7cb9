"""Strategies from names, and their errors."""

import json
import subprocess
import sys

import pytest
import tensorflow as tf

import loops
from conftest import ROOT, SUBPROCESS_ENV
from loops import topology


def test_mirrored_splits_the_cpu_into_replicas():
    strategy = loops.make_strategy("mirrored", 4)
    assert strategy.num_replicas_in_sync == 4
    assert topology.strategy_name(strategy) == "mirrored"


def test_central_storage_computes_on_the_cpu_split_and_keeps_one_copy_of_each_variable():
    strategy = loops.make_strategy("central_storage", 4)
    assert strategy.num_replicas_in_sync == 4
    assert topology.strategy_name(strategy) == "central_storage"
    assert [d.rsplit(":", 1)[-1] for d in strategy.extended.worker_devices] == ["0", "1", "2", "3"]
    with topology.variable_scope(strategy):
        statistic = tf.Variable(0.0, trainable=False)
        weight = tf.Variable(0.0)

    @tf.function
    def step():
        # A replica writes non-trainable state (as batch norm does); each adds its id.
        def replica_fn():
            context = tf.distribute.get_replica_context()
            statistic.assign(tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0)

        strategy.run(replica_fn)

    step()
    assert statistic.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA
    assert weight.aggregation == tf.VariableAggregation.NONE
    assert float(statistic.numpy()) == 1.0  # replica 0's value


@pytest.mark.parametrize("name", ["default", "one_device"])
def test_single_replica_strategies(name):
    strategy = loops.make_strategy(name)
    assert strategy.num_replicas_in_sync == 1
    assert topology.strategy_name(strategy) == name


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="Unknown strategy 'mirored'; choose one of default, "):
        loops.make_strategy("mirored")


@pytest.mark.parametrize(
    "count, message",
    [
        (0, "num_replicas must be a whole number >= 1, got 0"),
        (8, "Cannot split the CPU into 8 logical devices: TensorFlow already started with 4"),
    ],
)
def test_impossible_replica_counts(count, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        loops.make_strategy("mirrored", count)


def test_replicas_apply_only_to_mirrored():
    with pytest.raises(ValueError, match="applies only to --strategy=mirrored"):
        loops.make_strategy("one_device", 2)


def test_parameter_server_needs_a_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    unset = "no cluster was found: TF_CONFIG is unset, and neither SLURM"
    with pytest.raises(ValueError, match=unset):
        loops.make_strategy("parameter_server")
    workers_only = {"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker"}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(workers_only))
    with pytest.raises(ValueError, match="needs TF_CONFIG naming 'ps' and 'worker'.*Set TF_CONFIG"):
        loops.make_strategy("parameter_server")


def test_malformed_tf_config_is_named(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{cluster: oops")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        loops.make_strategy("multi_worker_mirrored")


def test_tpu_without_a_tpu_says_so():
    with pytest.raises(ValueError, match="--strategy=tpu found no reachable TPU"):
        loops.make_strategy("tpu")


def test_chief_detection(monkeypatch):
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    for index, chief in ((0, True), (1, False)):
        monkeypatch.setenv(
            "TF_CONFIG",
            json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

        class FakeStrategy:
            cluster_resolver = resolver

        assert topology.is_chief(FakeStrategy()) is chief
        assert topology.task_name(FakeStrategy()) == f"worker_{index}"


# TensorFlow decides when it is imported, so each setting runs in a process of
# its own. Unset, the answer depends on the CPU (TensorFlow turns oneDNN on by
# default only where it finds AVX-512 VNNI or BF16, AVX-VNNI or AMX), so the
# test compares with TensorFlow's own log line instead of guessing the CPU.
REPORT_ONEDNN = """
import os
from loops import topology
print(topology.onednn_enabled(), os.environ.get("TF_ENABLE_ONEDNN_OPTS"))
"""


@pytest.mark.parametrize("setting", [None, "0", "1"])
def test_onednn_enabled_agrees_with_tensorflows_log_and_leaves_the_switch_alone(setting):
    # The Loop's note on empty replicas depends on it (BUILD.md fact 17).
    env = {name: value for name, value in SUBPROCESS_ENV.items() if name != "TF_ENABLE_ONEDNN_OPTS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"  # TensorFlow logs "oneDNN custom operations are on" at INFO
    if setting is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = setting
    run = subprocess.run(
        [sys.executable, "-c", REPORT_ONEDNN],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    tensorflow_says_on = "oneDNN custom operations are on" in run.stderr
    # `import loops` neither sets nor changes the switch: TensorFlow's default stands.
    assert run.stdout == f"{tensorflow_says_on} {setting}\n"
    if setting is not None:
        assert tensorflow_says_on == (setting == "1")
