"""Strategies from names, and their errors."""

import json
import os
import platform

import pytest
import tensorflow as tf

import loops


def test_mirrored_splits_the_cpu_into_replicas():
    strategy = loops.make_strategy("mirrored", 4)
    assert strategy.num_replicas_in_sync == 4
    assert loops.strategies.strategy_name(strategy) == "mirrored"


def test_central_storage_computes_on_the_cpu_split_and_keeps_one_copy_of_each_variable():
    strategy = loops.make_strategy("central_storage", 4)
    assert strategy.num_replicas_in_sync == 4
    assert loops.strategies.strategy_name(strategy) == "central_storage"
    assert [d.rsplit(":", 1)[-1] for d in strategy.extended.worker_devices] == ["0", "1", "2", "3"]
    with loops.strategies.variable_scope(strategy):
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
    assert loops.strategies.strategy_name(strategy) == name


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="Unknown strategy 'mirored'; choose one of default, "):
        loops.make_strategy("mirored")


@pytest.mark.parametrize("count, message", [
    (0, "num_replicas must be a whole number >= 1, got 0"),
    (8, "Cannot split the CPU into 8 logical devices: TensorFlow already started with 4"),
])
def test_impossible_replica_counts(count, message):
    with pytest.raises((ValueError, RuntimeError), match=message):
        loops.make_strategy("mirrored", count)


def test_replicas_apply_only_to_mirrored():
    with pytest.raises(ValueError, match="applies only to --strategy=mirrored"):
        loops.make_strategy("one_device", 2)


def test_parameter_server_needs_a_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
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
        monkeypatch.setenv("TF_CONFIG", json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

        class FakeStrategy:
            cluster_resolver = resolver

        assert loops.strategies.is_chief(FakeStrategy()) is chief
        assert loops.strategies.task_name(FakeStrategy()) == f"worker_{index}"


def test_onednn_enabled_reads_tensorflows_own_switch():
    # The Loop's note on empty replicas depends on it (BUILD.md fact 17); loops
    # leaves TensorFlow's default, which is on for x86 CPUs.
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    expected = platform.machine() in ("x86_64", "AMD64") if setting is None else setting == "1"
    assert loops.strategies.onednn_enabled() == expected
