"""The private TensorFlow names loops relies on (`loops.topology`'s adapters) are still there:
a TensorFlow release that renames one fails here, by name, before the features built on it."""

import inspect

import pytest
from tensorflow.python.distribute import parameter_server_strategy_v2

from loops import topology


def test_a_parameter_server_strategy_counts_its_workers_where_topology_reads_them():
    # A real strategy would connect this process to a cluster: its source says where
    # it counts the `worker` tasks of the cluster it connects to.
    source = inspect.getsource(parameter_server_strategy_v2.ParameterServerStrategyV2)
    assert f"self.{topology.PARAMETER_SERVER_WORKERS} = len(" in source
    assert 'cluster_spec.as_dict().get("worker"' in source


def test_a_parameter_server_chief_counts_its_workers_and_itself():
    strategy = type("ParameterServerStrategyV2", (), {topology.PARAMETER_SERVER_WORKERS: 3})()
    assert topology.parameter_server_workers(strategy) == 3
    assert topology.num_workers(strategy) == 4
    unconnected = type("ParameterServerStrategyV2", (), {})()
    with pytest.raises(AttributeError, match=topology.PARAMETER_SERVER_WORKERS):
        topology.parameter_server_workers(unconnected)
