"""The private TensorFlow names loops relies on (`loops.tf_private`) are still there and do what
its adapters need: a TensorFlow release that renames one fails here, by name, before the
features built on it fail."""

import importlib
import inspect
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import parameter_server_strategy_v2, sharded_variable

from loops import tf_private, topology

DEVICES = ["/cpu:0", "/cpu:1"]  # two of the logical CPUs tests/conftest.py makes


def test_a_mirrored_strategy_keys_its_collectives_from_the_base_it_is_made_with():
    assert isinstance(getattr(tf.distribute.MirroredStrategy, tf_private.COLLECTIVE_KEY_BASE), int)
    tf_private.start_collective_keys_at(7_700_000)
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    assert getattr(strategy.extended, tf_private.COLLECTIVE_KEY_BASE) == 7_700_000
    ids = strategy.run(
        lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
    )
    assert float(strategy.reduce("SUM", ids, axis=None)) == 1.0  # 0 + 1, over the new keys


def test_per_replica_pipelines_leave_the_strategys_input_workers_as_they_were():
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    before = getattr(strategy.extended, tf_private.INPUT_WORKER_DEVICES)
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA
    )
    with tf_private.input_workers_kept(strategy):
        strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.range(4).batch(1), options
        )
    assert getattr(strategy.extended, tf_private.INPUT_WORKER_DEVICES) == before
    # What the restored devices are for: a dataset distributed afterwards still reads.
    batches = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))
    first = strategy.experimental_local_results(next(iter(batches)))
    np.testing.assert_array_equal(np.concatenate([t.numpy() for t in first]), [0, 1, 2, 3])


def test_a_plain_iterators_resource_reads_its_next_element_synchronously():
    iterator = iter(tf.data.Dataset.from_tensor_slices(np.array([5, 6, 7], np.int64)))
    resource = tf_private.iterator_resource(iterator)
    assert resource is not None
    (value,) = tf.raw_ops.IteratorGetNextSync(
        iterator=resource, output_types=[tf.int64], output_shapes=[tf.TensorShape([])]
    )
    assert int(value) == 5 and int(next(iterator)) == 6
    assert tf_private.iterator_resource([1, 2]) is None


def test_the_strategy_outside_every_scope_has_the_class_name_topology_calls_default():
    assert type(tf.distribute.get_strategy()).__name__ == tf_private.DEFAULT_STRATEGY_CLASS
    assert topology.strategy_name(tf.distribute.get_strategy()) == "default"


def test_a_parameter_server_strategy_counts_its_workers_where_the_adapter_reads_them():
    # A real strategy would connect this process to a cluster: its source says where
    # it counts the `worker` tasks of the cluster it connects to.
    source = inspect.getsource(parameter_server_strategy_v2.ParameterServerStrategyV2)
    assert f"self.{tf_private.PARAMETER_SERVER_WORKERS} = len(" in source
    assert 'cluster_spec.as_dict().get("worker"' in source
    strategy = type("ParameterServerStrategyV2", (), {tf_private.PARAMETER_SERVER_WORKERS: 3})()
    assert tf_private.parameter_server_workers(strategy) == 3
    assert topology.num_workers(strategy) == 4  # a parameter-server chief counts itself
    unconnected = type("ParameterServerStrategyV2", (), {})()
    with pytest.raises(AttributeError, match=tf_private.PARAMETER_SERVER_WORKERS):
        tf_private.parameter_server_workers(unconnected)


def test_a_parameter_server_chief_may_run_a_function_itself_once_the_adapter_allows_it():
    # The real `extended`, not connected: only the flags its check reads are set.
    extended = parameter_server_strategy_v2.ParameterServerStrategyV2Extended.__new__(
        parameter_server_strategy_v2.ParameterServerStrategyV2Extended
    )
    extended._used_with_coordinator = False
    setattr(extended, tf_private.RUN_WITHOUT_COORDINATOR, False)
    with pytest.raises(NotImplementedError, match="must be used with"):
        extended._assert_used_with_cluster_coordinator()
    tf_private.run_without_coordinator(type("Strategy", (), {"extended": extended})())
    extended._assert_used_with_cluster_coordinator()  # allowed now: no error


def test_onednn_enabled_is_tensorflows_answer_and_follows_the_switch():
    enabled = tf_private.onednn_enabled()
    assert isinstance(enabled, bool)
    switch = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    # Unset, the CPU decides: tests/test_strategies.py compares with TensorFlow's log line.
    assert enabled == (switch == "1") or switch is None


def test_the_shards_of_a_sharded_variable_and_a_plain_variable_alone():
    shards = [tf.Variable([[1.0]]), tf.Variable([[2.0]])]
    sharded = sharded_variable.ShardedVariable(shards)
    parts = tf_private.variable_parts(sharded)
    assert [float(part.numpy()[0, 0]) for part in parts] == [1.0, 2.0]
    assert all(part is shard for part, shard in zip(parts, shards))
    plain = tf.Variable([3.0])
    assert tf_private.variable_parts(plain) == [plain]


def test_a_plain_variable_inside_a_mirrored_scope_lies_on_its_device_alone_and_shards_join():
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        parts = [
            tf_private.variable_on_device(device, initial_value=[[float(i)]], name=f"p{i}")
            for i, device in enumerate(DEVICES)
        ]
        mirrored = tf.Variable([[0.0]])
    assert len(strategy.experimental_local_results(mirrored)) == 2
    assert [strategy.experimental_local_results(part) for part in parts] == [(p,) for p in parts]
    assert [part.device[-5:] for part in parts] == ["CPU:0", "CPU:1"]
    joined = tf_private.sharded_variable(parts, "joined")
    assert tf_private.variable_parts(joined) == parts
    assert tf.convert_to_tensor(joined).numpy().tolist() == [[0.0], [1.0]]


def test_autograph_calls_a_left_package_as_written_and_a_users_function_converted(
    tmp_path, monkeypatch
):
    package = tmp_path / "autograph_probe"
    package.mkdir()
    magnitude_source = "def magnitude(x):\n    if x < 0.0:\n        return -x\n    return x\n"
    (package / "__init__.py").write_text(
        "from loops import tf_private\n\n\n"
        "def call(function, x):\n    return function(x)\n\n\n"
        "def call_converted(function, x):\n"
        "    return tf_private.converted_as_the_caller_is(function)(x)\n\n\n" + magnitude_source
    )
    (package / "kinds.py").write_text(magnitude_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("autograph_probe")
    kinds = importlib.import_module("autograph_probe.kinds")
    module, rules, _, _ = tf_private.AUTOGRAPH_RULES
    config = importlib.import_module(module)
    monkeypatch.setattr(config, rules, getattr(config, rules))
    for _ in range(2):
        tf_private.leave_unconverted_by_autograph("autograph_probe", except_in=(kinds.__name__,))
    assert [str(rule) for rule in getattr(config, rules)[:3]] == [
        "Convert rule for autograph_probe.kinds",
        "DoNotConvert rule for autograph_probe",
        str(getattr(config, rules)[2]),
    ]
    assert sum("autograph_probe" in str(rule) for rule in getattr(config, rules)) == 2

    def magnitude(x):  # a user's Python `if` on a tensor
        if x < 0.0:
            return -x
        return x

    minus_two = tf.constant(-2.0)
    not_converted = "symbolic `tf.Tensor` as a Python `bool`"
    with pytest.raises(TypeError, match=not_converted):
        tf.function(lambda x: probe.call(magnitude, x))(minus_two)
    assert float(tf.function(lambda x: probe.call_converted(magnitude, x))(minus_two)) == 2
    # The left package's own function stays as written; its excepted subpackage's is converted.
    with pytest.raises(TypeError, match=not_converted):
        tf.function(lambda x: probe.call_converted(probe.magnitude, x))(minus_two)
    assert float(tf.function(lambda x: probe.call_converted(kinds.magnitude, x))(minus_two)) == 2
    # Where the caller's own code is not converted, neither is the user's.
    with pytest.raises(TypeError, match=not_converted):
        tf.function(lambda x: probe.call_converted(magnitude, x), autograph=False)(minus_two)


def test_loops_leaves_its_own_code_and_the_kinds_library_unconverted_but_converts_the_kinds():
    """The rules `loops.definition.executors` adds: the first rule that speaks for a module
    decides, so the library's rule must come before the kinds'."""
    from tensorflow.python.autograph.core import config_lib

    import loops.definition.executors  # noqa: F401  (adds the rules at import)

    module, rules, _, _ = tf_private.AUTOGRAPH_RULES
    config = importlib.import_module(module)

    def decided(name):
        for rule in getattr(config, rules):
            action = rule.get_action(importlib.import_module(name))
            if action != config_lib.Action.NONE:
                return action
        return None

    left, converted = config_lib.Action.DO_NOT_CONVERT, config_lib.Action.CONVERT
    assert decided("loops.kinds.library.retrieval_loss") == left
    assert decided("loops.kinds.library.ranking_metrics") == left
    assert decided("loops.definition.executors") == left
    assert decided("loops.kinds.retrieval") == converted
    assert decided("loops.kinds.rl.environment_loop") == converted


def test_an_object_saved_as_one_value_restores_into_a_variable_and_a_variables_into_it(
    tmp_path,
):
    trackable_class = tf
    for name in tf_private.TRACKABLE:
        trackable_class = getattr(trackable_class, name)
    for method in tf_private.SAVE_AND_RESTORE:
        assert callable(getattr(trackable_class, method)), method
    assert issubclass(tf_private.SavedAsOneValue, trackable_class)

    class Doubled(tf_private.SavedAsOneValue):
        """Saves twice its variable; restores half of what it is given."""

        def __init__(self, values):
            super().__init__()
            self.variable = tf.Variable(values)
            self.dtype, self.device = tf.float32, self.variable.device
            self.checkpoint_name, self.reads = "doubled", 0

        def whole_value(self):
            self.reads += 1
            return self.variable * 2

        def restore_whole(self, value):
            return self.variable.assign(value / 2)

    doubled = Doubled([1.0, 2.0])
    path = tf.train.Checkpoint(table=doubled).write(str(tmp_path / "doubled"))
    assert doubled.reads == 1  # read as it saved
    plain = tf.Variable([0.0, 0.0])
    tf.train.Checkpoint(table=plain).read(path).assert_consumed()
    np.testing.assert_array_equal(plain.numpy(), [2.0, 4.0])  # under a variable's key
    path = tf.train.Checkpoint(table=tf.Variable([6.0, 8.0])).write(str(tmp_path / "plain"))
    restored = Doubled([0.0, 0.0])
    tf.train.Checkpoint(table=restored).read(path).assert_consumed()
    np.testing.assert_array_equal(restored.variable.numpy(), [3.0, 4.0])
    assert restored.reads == 0  # a restore never calls what a save reads
